#include "collectives/communicator.h"

#include <numeric>
#include <utility>

#include <ATen/ops/full.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoshard::collectives {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

absl::Duration HangFailureBound(absl::Duration timeout) {
  return timeout + kPeerFailurePoll + kFailureReportWindow;
}

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

OpKind KindOf(const CollectiveOp& op) {
  struct Visitor {
    OpKind operator()(const AllReduceOp&) const { return OpKind::kAllReduce; }
    OpKind operator()(const ReduceScatterOp&) const { return OpKind::kReduceScatter; }
    OpKind operator()(const AllGatherOp&) const { return OpKind::kAllGather; }
    OpKind operator()(const BroadcastOp&) const { return OpKind::kBroadcast; }
    OpKind operator()(const AllToAllOp&) const { return OpKind::kAllToAll; }
  };
  return std::visit(Visitor{}, op);
}

absl::StatusOr<std::unique_ptr<Work>> Communicator::AllReduce(at::Tensor tensor,
                                                              const AllReduceOptions& options) {
  std::vector<CollectiveOp> ops;
  ops.push_back(AllReduceOp{std::move(tensor), options});
  return LaunchGroup(std::move(ops));
}

absl::StatusOr<std::unique_ptr<Work>> Communicator::ReduceScatter(
    at::Tensor input, at::Tensor output, const ReduceScatterOptions& options) {
  std::vector<CollectiveOp> ops;
  ops.push_back(ReduceScatterOp{std::move(input), std::move(output), options});
  return LaunchGroup(std::move(ops));
}

absl::StatusOr<std::unique_ptr<Work>> Communicator::AllGather(at::Tensor input, at::Tensor output,
                                                              const AllGatherOptions& options) {
  std::vector<CollectiveOp> ops;
  ops.push_back(AllGatherOp{std::move(input), std::move(output), options});
  return LaunchGroup(std::move(ops));
}

absl::StatusOr<std::unique_ptr<Work>> Communicator::Broadcast(at::Tensor tensor,
                                                              const BroadcastOptions& options) {
  std::vector<CollectiveOp> ops;
  ops.push_back(BroadcastOp{std::move(tensor), options});
  return LaunchGroup(std::move(ops));
}

absl::StatusOr<std::unique_ptr<Work>> Communicator::AllToAll(at::Tensor input, at::Tensor output,
                                                             const AllToAllOptions& options) {
  std::vector<CollectiveOp> ops;
  ops.push_back(AllToAllOp{std::move(input), std::move(output), options});
  return LaunchGroup(std::move(ops));
}

namespace {

// How ResolveSizes' messages name the sizes and what they cut.
struct SizesNaming {
  std::string list;   // "shard_sizes", "input_split_sizes"
  std::string equal;  // "equal shards need a numel", "equal splits need an input dim 0"
  std::string total;  // "numel", "input dim 0 of"
};

// ResolveShardSizes and ResolveSplitSizes: `sizes` if they are one non-negative entry per rank
// summing to `total`, else equal parts of `total`.
absl::StatusOr<std::vector<int64_t>> ResolveSizes(const std::vector<int64_t>& sizes, int64_t total,
                                                  int size, const SizesNaming& naming) {
  if (sizes.empty()) {
    if (total % size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(naming.equal, " divisible by ", size, " ranks; got ", total));
    }
    return std::vector<int64_t>(size, total / size);
  }
  if (static_cast<int>(sizes.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(naming.list, " has ", sizes.size(),
                                                   " entries, expected one per rank (", size, ")"));
  }
  for (int64_t s : sizes) {
    if (s < 0) {
      return absl::InvalidArgumentError(absl::StrCat(naming.list, " has a negative entry: [",
                                                     absl::StrJoin(sizes, ","), "]"));
    }
  }
  const int64_t sum = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (sum != total) {
    return absl::InvalidArgumentError(absl::StrCat(naming.list, " [", absl::StrJoin(sizes, ","),
                                                   "] sum to ", sum, ", expected ", naming.total,
                                                   " ", total));
  }
  return sizes;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ResolveShardSizes(const std::vector<int64_t>& shard_sizes,
                                                       int64_t total, int size) {
  return ResolveSizes(shard_sizes, total, size,
                      {"shard_sizes", "equal shards need a numel", "numel"});
}

absl::StatusOr<std::vector<int64_t>> ResolveSplitSizes(const std::vector<int64_t>& split_sizes,
                                                       int64_t rows, int size,
                                                       const std::string& side) {
  const std::string article = side == "input" ? "an " : "a ";
  return ResolveSizes(split_sizes, rows, size,
                      {absl::StrCat(side, "_split_sizes"),
                       absl::StrCat("equal splits need ", article, side, " dim 0"),
                       absl::StrCat(side, " dim 0 of")});
}

absl::StatusOr<bool> AllRanksOk(Communicator& comm, bool ok) {
  at::Tensor failed =
      at::full({1}, ok ? 0.0f : 1.0f, at::TensorOptions(at::kFloat).device(comm.device()));
  absl::StatusOr<std::unique_ptr<Work>> work = comm.AllReduce(failed);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->Wait(comm.timeout()); !s.ok()) return s;
  return failed.item<float>() == 0.0f;
}

}  // namespace orthoshard::collectives
