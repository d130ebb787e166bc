// The collectives that synchronise a ParamAndGradBuffer's buckets across data-parallel ranks — the
// one definition of a grad sync and a param sync (Megatron-LM's _ParamAndGradBucketGroup
// start/finish_grad_sync and start/finish_param_sync), in place on the buffer's views:
//
//   grad sync   kReduceScatter: each bucket of grad_data is reduced into this rank's shard of it
//               (sharded optimizers then read GradShard(bucket, rank) only);
//               kAllReduce: each bucket is reduced whole on every rank (replicated optimizers), as
//               the same reduce-scatter followed by an all-gather of the reduced shard back into
//               the bucket (collectives/communicator.h). So both kinds sum every element in one
//               order: the one the bucket's shard partition gives it (the ring's order depends on
//               the shard an element falls in), and a replicated run's mean gradient is bitwise a
//               sharded run's over the same layout at any dp, not only where the engine's
//               all-reduce happens to associate the terms alike (dp <= 2).
//   param sync  this rank's shard of each bucket of param_data is all-gathered into the bucket, so
//               every rank holds what every owner updated.
//
// The bucket groups (buffers/bucket_group.h) launch these ops group by group as backward, the
// optimizer's step and forward go (driven by DDP's hooks and the distributed optimizer); the
// whole-buffer helpers below launch the same ops for code that drives the sync itself outside a
// training step (checkpoint loads, tests, benchmarks).
//
// Cross-rank contract: every rank launches the same ops for the same buckets in the same order.
#ifndef ORTHOSHARD_BUFFERS_BUCKET_SYNC_H_
#define ORTHOSHARD_BUFFERS_BUCKET_SYNC_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"

namespace orthoshard::buffers {

enum class GradSync {
  kReduceScatter,  // rank r ends with shard r of every bucket reduced
  kAllReduce,      // every rank ends with every bucket reduced
};

// The grad sync ops of `buckets` (indices into buffer.layout().buckets): kind kReduceScatter, one
// reduce-scatter per bucket; kAllReduce, per bucket that reduce-scatter and, at dp > 1, an
// all-gather of its shard into the bucket (at dp 1 the one shard is the bucket). Reduction `op`
// is kSum or kAvg (collectives/communicator.h), this rank being `rank` of buffer.layout().dp
// ranks. Launch them as one group. Precondition: kAllReduce only with full residency.
std::vector<collectives::CollectiveOp> GradSyncOps(const ParamAndGradBuffer& buffer,
                                                   absl::Span<const int> buckets, GradSync kind,
                                                   collectives::ReduceOp op, int rank);

// One all-gather per bucket in `buckets`: shard `rank` of the params into the bucket (in place for
// full residency; from the persistent shard into the materialized transient bucket for sharded).
std::vector<collectives::CollectiveOp> ParamSyncOps(const ParamAndGradBuffer& buffer,
                                                    absl::Span<const int> buckets, int rank);

// The grad sync of every bucket of every buffer, one LaunchGroup per bucket group, on `comm`.
// Errors: kInvalidArgument when a buffer's dp differs from comm.size(); those of LaunchGroup.
absl::StatusOr<std::vector<std::unique_ptr<collectives::Work>>> LaunchGradSync(
    collectives::Communicator& comm, absl::Span<ParamAndGradBuffer* const> buffers, GradSync kind,
    collectives::ReduceOp op);

// The param sync of every bucket of every buffer with full residency, one LaunchGroup per bucket
// group. Buffers with sharded residency are skipped: they hold no full params between uses (their
// users gather buckets when they need them, e.g. DDP per layer). Errors: as LaunchGradSync.
absl::StatusOr<std::vector<std::unique_ptr<collectives::Work>>> LaunchParamSync(
    collectives::Communicator& comm, absl::Span<ParamAndGradBuffer* const> buffers);

// Waits for every work, in order, each with `timeout`, and clears `works`. Errors: the first
// Wait error (every work is still waited on).
absl::Status WaitAll(std::vector<std::unique_ptr<collectives::Work>>& works,
                     absl::Duration timeout);

}  // namespace orthoshard::buffers

#endif  // ORTHOSHARD_BUFFERS_BUCKET_SYNC_H_
