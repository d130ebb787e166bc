// The Communicator interface: asynchronous collectives (all-reduce, tensor-form reduce-scatter and
// all-gather, broadcast, all-to-all with uneven splits, barrier, grouped launches) over the ranks of
// one group (the data-parallel group, or a mesh role's: mesh.h), with a Work handle per launch and
// logical traffic counters. Backends: Gloo on CPU (gloo_communicator.h), NCCL on CUDA tensors under
// --config=cuda (nccl_communicator.h); both over the shared c10d wrapper in
// internal/c10d_communicator.h.
//
// Cross-rank contract (as NCCL's "group semantics" and c10d's ProcessGroup):
//   - Every rank must launch the same collectives, with the same kinds, element counts, dtypes and
//     options, in the same order. Launches are matched by their position in that order (the
//     "collective sequence number" that error messages print as `#N`); a mismatch is undefined
//     behaviour of the engine (usually a hang until the timeout, or garbage).
//   - A launch only enqueues the work. Tensors passed to a launch must stay alive and untouched
//     until Wait() returns. Results are only defined after Wait() returns OK: finishing steps
//     (AVG division, copying a reduce-scatter shard, unpacking uneven all-gathers) run inside Wait.
//   - One exception, within a group: a reduce-scatter written in place (its output is this rank's
//     slot of its input) followed by an all-gather of that output back into the same input. The
//     all-gather reads the reduced shard (for AVG already divided), so the pair all-reduces the
//     input with every element summed exactly as the reduce-scatter alone sums it (the grad
//     all-reduce of buffers/bucket_sync.h). Both engines order the pair: Gloo's ring runs its
//     operations one after another on one thread, NCCL's share a stream.
//   - Wait(timeout) returns OK once this rank's part of the collective completed; it does not
//     imply that other ranks have finished theirs. Every Work must be waited on, in any order.
//   - A failed or timed-out collective leaves the communicator unusable: every later launch may
//     fail, and once one fails for this reason its error ends with the first failure's message
//     (which names the collective and the ranks blamed). Destroy it (destruction returns within
//     the configured timeout) and fail the job.
//   - A rank whose collective failed, or whose Wait(timeout) with at least timeout() ran out, has
//     given up on it and says so in the group's store. Under Gloo a rank blocked in Wait on that
//     collective or a later one fails it within kPeerFailurePoll of that report instead of waiting
//     out its own timeout (so a hung rank ends the wait of every peer within HangFailureBound).
//     Each failure then waits up to kFailureReportWindow for the other ranks' reports, to name
//     which ranks reported a failure of their own and which stayed silent (the likely lost ones).
//   - Error codes from Wait: kDeadlineExceeded when `timeout` passed first; kUnavailable when the
//     engine reported a failure (a peer died, closed the connection or timed out). Messages name
//     the collective and its sequence number, and the ranks that had not launched it when that can
//     be known.
#ifndef ORTHOSHARD_COLLECTIVES_COMMUNICATOR_H_
#define ORTHOSHARD_COLLECTIVES_COMMUNICATOR_H_

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace orthoshard::collectives {

enum class ReduceOp {
  kSum,
  kAvg,  // the sum divided by the number of ranks; floating-point dtypes only
  kMax,  // the elementwise maximum (the engine's MAX, exact); all-reduce only
};
const char* ReduceOpName(ReduceOp op);  // "sum", "avg", "max"

// Kinds of collective, for traffic counters and error messages.
enum class OpKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kAllToAll };
inline constexpr int kNumOpKinds = 6;
const char* OpKindName(OpKind kind);  // "all_reduce", "reduce_scatter", ..., "all_to_all"

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;  // kSum or kAvg (the Gloo ring only adds)
  // Elements of the input that each rank receives, in rank order; must sum to the input's numel.
  // Empty means equal shards: input numel / size each (the input must divide evenly). Entries may
  // be 0 (a rank with an empty shard).
  std::vector<int64_t> shard_sizes;
};

struct AllGatherOptions {
  // Elements each rank contributes, in rank order; must sum to the output's numel. Empty means
  // equal shards of output numel / size. Entries may be 0.
  std::vector<int64_t> shard_sizes;
};

struct BroadcastOptions {
  int root = 0;  // rank whose tensor is copied to every rank
};

struct BarrierOptions {};

struct AllToAllOptions {
  // Rows (slices along dim 0) of the input sent to each rank, in rank order; must sum to the
  // input's dim 0. Empty means equal splits: input dim 0 / size each (must divide evenly). Entries
  // may be 0.
  std::vector<int64_t> input_split_sizes;
  // Rows of the output received from each rank, in rank order; must sum to the output's dim 0.
  // Empty means equal splits of the output's dim 0. Entries may be 0.
  std::vector<int64_t> output_split_sizes;
};

// In-place all-reduce of `tensor` (any shape, contiguous).
struct AllReduceOp {
  at::Tensor tensor;
  AllReduceOptions options;
};

// Reduces `input` across ranks and writes this rank's shard into `output` (tensor form, as
// torch.distributed.reduce_scatter_tensor). `input` is contiguous with numel = sum of shard sizes;
// `output` is contiguous with numel = this rank's shard size and the same dtype; `output` may be a
// view into `input` (the usual in-place bucket shard). The contents of `input` outside `output`
// are unspecified after the op.
struct ReduceScatterOp {
  at::Tensor input;
  at::Tensor output;
  ReduceScatterOptions options;
};

// Gathers every rank's `input` into `output` in rank order (as all_gather_into_tensor). `input`
// has this rank's shard size; `output` the sum of shard sizes, same dtype; both contiguous;
// `input` may be the view of `output` at this rank's offset.
struct AllGatherOp {
  at::Tensor input;
  at::Tensor output;
  AllGatherOptions options;
};

struct BroadcastOp {
  at::Tensor tensor;
  BroadcastOptions options;
};

// Exchanges rows between all ranks (as torch.distributed.all_to_all_single): this rank's `input`
// is cut along dim 0 into consecutive splits of input_split_sizes[j] rows, split j sent to rank j;
// what rank j sends here lands in `output` at split j of output_split_sizes (rank order). `input`
// and `output` are contiguous, have at least one dimension, the same dtype and the same trailing
// dims (a row's shape: [N, 3] and [M, 3]); either may have 0 rows. They must not overlap. The split
// to and from this rank itself is a local copy.
// Cross-rank contract, besides the launch order: rank i's input_split_sizes[j] must equal rank j's
// output_split_sizes[i] (rank j receives exactly what rank i sends it), and the trailing dims and
// dtype must be the same on every rank; a mismatch is undefined behaviour of the engine (a hang
// until the timeout, an engine error, or garbage). Mixture-of-experts token dispatch exchanges its
// split sizes first (an equal-split all-to-all of one count per rank) to meet it.
struct AllToAllOp {
  at::Tensor input;   // [sum(input_split_sizes), ...]
  at::Tensor output;  // [sum(output_split_sizes), ...], the same trailing dims
  AllToAllOptions options;
};

using CollectiveOp =
    std::variant<AllReduceOp, ReduceScatterOp, AllGatherOp, BroadcastOp, AllToAllOp>;
OpKind KindOf(const CollectiveOp& op);

// How often a rank blocked in Wait (Gloo) asks the group's store whether a peer gave up on the
// collective it waits for or an earlier one (the file comment); each ask is one store round trip.
inline constexpr absl::Duration kPeerFailurePoll = absl::Milliseconds(500);

// How long a failed collective's Wait waits for the other ranks' failure reports before it returns
// (the report names the silent ranks). Every rank still waiting on the collective reports within
// kPeerFailurePoll of the first report; the rest is headroom for a loaded machine.
inline constexpr absl::Duration kFailureReportWindow = absl::Seconds(3);

// When a rank hangs (SIGSTOP, a stuck device: alive, its connections open, sending nothing), every
// other rank blocked in Wait on a collective that needs it has returned an error within
// HangFailureBound(t) of entering its Wait, where t is the communicator's timeout() and the first
// of them waits with a timeout of t: the first gives up when t passed, the others within
// kPeerFailurePoll of its report, each after kFailureReportWindow. That is
// t + kPeerFailurePoll + kFailureReportWindow (Gloo; under NCCL each waits out its own t).
absl::Duration HangFailureBound(absl::Duration timeout);

// Handle to a launched collective (or group of collectives). Not thread-safe.
class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the work completed, failed, or `timeout` passed. Runs the finishing steps (see the
  // file comment) on success; calling it again after it returned OK returns OK at once.
  // Errors: kDeadlineExceeded, kUnavailable (see the file comment).
  virtual absl::Status Wait(absl::Duration timeout) = 0;
};

// Calls and bytes per kind of collective. `bytes` are LOGICAL: the size of the full (unsharded)
// tensor of each collective (all-reduce: the tensor; reduce-scatter: the input; all-gather: the
// output; broadcast: the tensor; all-to-all: this rank's input), independent of how the engine
// moves them. `wire_bytes` are what this rank sends: counted exactly for the ring reduce-scatter
// and all-gather (the Gloo communicator's: (N - 1)/N of the logical bytes, the ideal) and for
// all-to-all (the input rows outside this rank's own split), and for the engine's own collectives
// what a ring sends per rank: 2 (N - 1)/N of an all-reduce, (N - 1)/N of a reduce-scatter,
// all-gather or broadcast (an engine may move more; a reduce-scatter emulated by an all-reduce
// counts as the all-reduce).
struct TrafficCounters {
  std::array<int64_t, kNumOpKinds> calls{};
  std::array<int64_t, kNumOpKinds> bytes{};
  std::array<int64_t, kNumOpKinds> wire_bytes{};

  int64_t Calls(OpKind kind) const { return calls[static_cast<int>(kind)]; }
  int64_t Bytes(OpKind kind) const { return bytes[static_cast<int>(kind)]; }
  int64_t WireBytes(OpKind kind) const { return wire_bytes[static_cast<int>(kind)]; }
};

// A group of `size()` ranks. Not thread-safe: launch from one thread per rank.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Name of the engine: "gloo", "nccl".
  virtual std::string backend_name() const = 0;
  // The timeout applied inside the engine to every collective; also the default for waits.
  virtual absl::Duration timeout() const = 0;
  // The device every tensor passed to this communicator must be on: CPU for Gloo, this rank's GPU
  // for NCCL. Callers that build small tensors for a collective (flags, statistics) put them here.
  virtual at::Device device() const = 0;

  // Launches `ops` back to back as one group and returns one Work that completes when all of them
  // have. Each op counts as one collective in the cross-rank order. An empty group is an error.
  // Errors (at launch, nothing is enqueued): kInvalidArgument naming the op's index, kind and the
  // offending property (undefined or non-contiguous tensor, shard or split sizes, dtype mismatch,
  // AVG of an integer dtype, MAX in a reduce-scatter, root out of range, all-to-all rows of
  // different shapes); kFailedPrecondition after an earlier failure.
  virtual absl::StatusOr<std::unique_ptr<Work>> LaunchGroup(std::vector<CollectiveOp> ops) = 0;

  // Synchronizes all ranks. Errors as LaunchGroup.
  virtual absl::StatusOr<std::unique_ptr<Work>> Barrier(const BarrierOptions& options = {}) = 0;

  // A snapshot of the traffic launched so far by this rank.
  virtual TrafficCounters traffic() const = 0;

  // Single-op conveniences over LaunchGroup.
  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor tensor,
                                                  const AllReduceOptions& options = {});
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(at::Tensor input, at::Tensor output,
                                                      const ReduceScatterOptions& options = {});
  absl::StatusOr<std::unique_ptr<Work>> AllGather(at::Tensor input, at::Tensor output,
                                                  const AllGatherOptions& options = {});
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor tensor,
                                                  const BroadcastOptions& options = {});
  absl::StatusOr<std::unique_ptr<Work>> AllToAll(at::Tensor input, at::Tensor output,
                                                 const AllToAllOptions& options = {});
};

// Shard sizes of `total` elements over `size` ranks as the options describe: `shard_sizes` if
// given, else equal shards. Errors: kInvalidArgument if the given sizes have the wrong count, a
// negative entry or the wrong sum, or if `total` does not divide evenly.
absl::StatusOr<std::vector<int64_t>> ResolveShardSizes(const std::vector<int64_t>& shard_sizes,
                                                       int64_t total, int size);

// Rows per rank of an all-to-all's input or output (`side`: "input" or "output") with `rows` rows
// over `size` ranks: `split_sizes` if given, else equal splits. Errors: kInvalidArgument if the
// given sizes have the wrong count, a negative entry or the wrong sum ("input_split_sizes [1,2] sum
// to 3, expected input dim 0 of 4"), or if `rows` does not divide evenly.
absl::StatusOr<std::vector<int64_t>> ResolveSplitSizes(const std::vector<int64_t>& split_sizes,
                                                       int64_t rows, int size,
                                                       const std::string& side);

// Whether `ok` holds on every rank of `comm`: one SUM all-reduce of a "failed here" flag on
// comm.device(), waited for with comm.timeout(); also a barrier. Every rank must call it. Errors:
// the communicator's.
absl::StatusOr<bool> AllRanksOk(Communicator& comm, bool ok);

}  // namespace orthoshard::collectives

#endif  // ORTHOSHARD_COLLECTIVES_COMMUNICATOR_H_
