#include "buffers/bucket_sync.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::buffers {
namespace {

absl::Status CheckDp(const ParamAndGradBuffer& buffer, int size) {
  if (buffer.layout().dp != size) {
    return absl::InvalidArgumentError(absl::StrCat("buffer ", buffer.layout().key.ToString(),
                                                   " is laid out for dp ", buffer.layout().dp,
                                                   ", the communicator has ", size, " ranks"));
  }
  return absl::OkStatus();
}

template <typename MakeOps>
absl::StatusOr<std::vector<std::unique_ptr<collectives::Work>>> LaunchPerBucketGroup(
    collectives::Communicator& comm, absl::Span<ParamAndGradBuffer* const> buffers,
    MakeOps make_ops) {
  std::vector<std::unique_ptr<collectives::Work>> works;
  for (ParamAndGradBuffer* buffer : buffers) {
    RETURN_IF_ERROR(CheckDp(*buffer, comm.size()));
    for (const BucketGroup& group : buffer->bucket_groups()) {
      std::vector<collectives::CollectiveOp> ops = make_ops(*buffer, group.buckets);
      if (ops.empty()) continue;
      ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, comm.LaunchGroup(std::move(ops)));
      works.push_back(std::move(work));
    }
  }
  return works;
}

}  // namespace

std::vector<collectives::CollectiveOp> GradSyncOps(const ParamAndGradBuffer& buffer,
                                                   absl::Span<const int> buckets, GradSync kind,
                                                   collectives::ReduceOp op, int rank) {
  assert(kind == GradSync::kReduceScatter || buffer.residency() == Residency::kFull);
  std::vector<collectives::CollectiveOp> ops;
  for (int b : buckets) {
    // In place: with full residency the shard is a view of the bucket at this rank's slot.
    ops.push_back(
        collectives::ReduceScatterOp{buffer.GradBucket(b), buffer.GradShard(b, rank), {op, {}}});
    if (kind == GradSync::kAllReduce && buffer.layout().dp > 1) {
      ops.push_back(collectives::AllGatherOp{buffer.GradShard(b, rank), buffer.GradBucket(b), {}});
    }
  }
  return ops;
}

std::vector<collectives::CollectiveOp> ParamSyncOps(const ParamAndGradBuffer& buffer,
                                                    absl::Span<const int> buckets, int rank) {
  std::vector<collectives::CollectiveOp> ops;
  for (int b : buckets) {
    ops.push_back(collectives::AllGatherOp{buffer.ParamShard(b, rank), buffer.ParamBucket(b), {}});
  }
  return ops;
}

absl::StatusOr<std::vector<std::unique_ptr<collectives::Work>>> LaunchGradSync(
    collectives::Communicator& comm, absl::Span<ParamAndGradBuffer* const> buffers, GradSync kind,
    collectives::ReduceOp op) {
  return LaunchPerBucketGroup(comm, buffers,
                              [&](const ParamAndGradBuffer& buffer, absl::Span<const int> buckets) {
                                return GradSyncOps(buffer, buckets, kind, op, comm.rank());
                              });
}

absl::StatusOr<std::vector<std::unique_ptr<collectives::Work>>> LaunchParamSync(
    collectives::Communicator& comm, absl::Span<ParamAndGradBuffer* const> buffers) {
  return LaunchPerBucketGroup(comm, buffers,
                              [&](const ParamAndGradBuffer& buffer, absl::Span<const int> buckets) {
                                if (buffer.residency() == Residency::kSharded) {
                                  return std::vector<collectives::CollectiveOp>();
                                }
                                return ParamSyncOps(buffer, buckets, comm.rank());
                              });
}

absl::Status WaitAll(std::vector<std::unique_ptr<collectives::Work>>& works,
                     absl::Duration timeout) {
  absl::Status first;
  for (std::unique_ptr<collectives::Work>& w : works) {
    absl::Status s = w->Wait(timeout);
    if (first.ok() && !s.ok()) first = s;
  }
  works.clear();
  return first;
}

}  // namespace orthoshard::buffers
