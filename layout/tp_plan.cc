#include "layout/tp_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "layout/tp_homes.h"

namespace orthoshard::layout {
namespace {

// The [rows, cols] of each logical matrix of a [rows, cols] weight split as `blocks`.
std::vector<std::pair<int64_t, int64_t>> BlockShapes(int64_t rows, int64_t cols,
                                                     const FusedBlocks& blocks) {
  if (blocks.block_rows.empty()) return {{rows, cols}};
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t r : blocks.block_rows) shapes.emplace_back(blocks.num_groups * r, cols);
  return shapes;
}

absl::Status ValidateBlocks(const std::string& name, const FusedBlocks& blocks, int64_t rows) {
  if (blocks.block_rows.empty()) return absl::OkStatus();
  int64_t sum = 0;
  for (int64_t r : blocks.block_rows) {
    if (r < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("param '", name, "': fused split block rows must be >= 1, got [",
                       absl::StrJoin(blocks.block_rows, ", "), "]"));
    }
    sum += r;
  }
  if (blocks.num_groups < 1 || blocks.num_groups * sum != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("param '", name, "': fused split ", blocks.num_groups, " groups x ", sum,
                     " rows = ", blocks.num_groups * sum, " rows, weight has ", rows));
  }
  return absl::OkStatus();
}

// One Muon param as the plan sees it.
struct Matrix {
  bool split = false;        // split over the tp group
  int64_t shard_numel = 0;   // elements on each tp rank
  int64_t global_flops = 0;  // NS FLOPs over the global logical matrices
  int64_t local_flops = 0;   // NS FLOPs over one rank's slice's logical matrices
  double cost = 0;           // max(m,n)·min(m,n)² over the global logical matrices
};

absl::StatusOr<Matrix> DescribeMatrix(const ParamSpec& p, const FusedBlocks& blocks,
                                      const TpPlanOptions& options) {
  Matrix m;
  m.split = p.tp.split();
  m.shard_numel = p.numel();
  const std::vector<int64_t> global = TpGlobalShape(p.shape, p.tp);
  RETURN_IF_ERROR(ValidateBlocks(p.name, blocks, global[0]));
  for (const auto& [rows, cols] : BlockShapes(global[0], global[1], blocks)) {
    m.global_flops += NsFlops(rows, cols, options.ns_steps);
    const double lo = static_cast<double>(std::min(rows, cols));
    m.cost += static_cast<double>(std::max(rows, cols)) * lo * lo;
  }
  if (!m.split) {
    m.local_flops = m.global_flops;
    return m;
  }
  ASSIGN_OR_RETURN(const FusedBlocks local, TpLocalBlocks(blocks, p.tp, "param '" + p.name + "'"));
  for (const auto& [rows, cols] : BlockShapes(p.shape[0], p.shape[1], local)) {
    m.local_flops += NsFlops(rows, cols, options.ns_steps);
  }
  return m;
}

void Summarise(TpModePlan* m) {
  const size_t ranks = m->rank_ns_flops.size();
  m->total_ns_flops = std::accumulate(m->rank_ns_flops.begin(), m->rank_ns_flops.end(), int64_t{0});
  m->max_ns_flops = *std::max_element(m->rank_ns_flops.begin(), m->rank_ns_flops.end());
  m->mean_ns_flops = static_cast<double>(m->total_ns_flops) / static_cast<double>(ranks);
  m->ns_imbalance =
      m->total_ns_flops > 0 ? static_cast<double>(m->max_ns_flops) / m->mean_ns_flops : 1.0;
  m->max_tp_bytes = *std::max_element(m->rank_tp_bytes.begin(), m->rank_tp_bytes.end());
  m->mean_tp_bytes = static_cast<double>(std::accumulate(m->rank_tp_bytes.begin(),
                                                         m->rank_tp_bytes.end(), int64_t{0})) /
                     static_cast<double>(ranks);
}

absl::Status ValidateOptions(const TpPlanOptions& o) {
  if (o.tp < 1 || o.tp > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--tp is ", o.tp, "; expected 1 to 2^20"));
  }
  if (o.ns_steps < 1 || o.ns_steps >= 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ns_steps is ", o.ns_steps, "; expected 1 to 99"));
  }
  if (o.update_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("update bytes per element is ", o.update_bytes, "; expected >= 1"));
  }
  if (o.layout.expert_dp != 0 && o.layout.expert_dp != o.layout.dp) {
    return absl::InvalidArgumentError(absl::StrCat("--expert_dp is ", o.layout.expert_dp,
                                                   "; the tp plan needs 0 or --dp (", o.layout.dp,
                                                   "): one expert-parallel group"));
  }
  if (o.layout.muon_strategy == Strategy::kDistOpt) {
    return absl::InvalidArgumentError(
        "--strategy=distopt: Muon needs whole matrices; the tp plan needs layerwise or "
        "megatron_lpt");
  }
  return absl::OkStatus();
}

}  // namespace

const char* TpMuonModeName(TpMuonMode mode) {
  switch (mode) {
    case TpMuonMode::kOwner:
      return "owner";
    case TpMuonMode::kDuplicated:
      return "duplicated";
    case TpMuonMode::kBlockwise:
      return "blockwise";
  }
  return "?";
}

const TpModePlan& TpPlan::mode(TpMuonMode m) const {
  switch (m) {
    case TpMuonMode::kOwner:
      return owner;
    case TpMuonMode::kDuplicated:
      return duplicated;
    case TpMuonMode::kBlockwise:
      return blockwise;
  }
  return owner;
}

int64_t NsFlops(int64_t rows, int64_t cols, int ns_steps) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  return ns_steps * (4 * m * m * n + 2 * m * m * m);
}

absl::StatusOr<FusedBlocks> TpLocalBlocks(const FusedBlocks& global, const TpSplit& split,
                                          const std::string& what) {
  if (global.block_rows.empty() || !split.split() || split.dim == 1) return global;
  const int64_t tp = split.size;
  if (split.parts == 1 && global.num_groups % tp == 0) {
    return FusedBlocks{global.num_groups / tp, global.block_rows};
  }
  const int64_t rows = global.num_groups * std::accumulate(global.block_rows.begin(),
                                                           global.block_rows.end(), int64_t{0});
  const bool one_block_per_part =
      global.num_groups == 1 && split.parts == static_cast<int64_t>(global.block_rows.size()) &&
      std::all_of(global.block_rows.begin(), global.block_rows.end(),
                  [&](int64_t r) { return r * split.parts == rows && r % tp == 0; });
  if (one_block_per_part) {
    FusedBlocks local{1, {}};
    for (int64_t r : global.block_rows) local.block_rows.push_back(r / tp);
    return local;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": tp slices (", split.ToString(),
      ") do not hold whole logical matrices of its fused "
      "split (",
      global.num_groups, " groups x [", absl::StrJoin(global.block_rows, ", "), "] rows)"));
}

absl::StatusOr<TpPlan> PlanTpMuon(const std::vector<ParamSpec>& params,
                                  const std::map<std::string, FusedBlocks>& splits,
                                  const TpPlanOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  const int tp = options.tp;
  std::map<std::string, int> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].name, static_cast<int>(i));
  for (const auto& [name, blocks] : splits) {
    auto it = index.find(name);
    if (it == index.end() || params[it->second].role != ParamRole::kMuon) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused split for '", name, "': no Muon param of that name"));
    }
  }
  for (const ParamSpec& p : params) {
    if (p.tp.dim >= 0 && p.tp.size != tp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", p.name, "': split over a tp group of ", p.tp.size, ", the plan's tp is ", tp));
    }
    RETURN_IF_ERROR(ValidateTpSplit(TpGlobalShape(p.shape, p.tp), p.tp, "param '" + p.name + "'"));
  }
  ASSIGN_OR_RETURN(const FullParamLayout layout, ComputeFullParamLayout(params, options.layout));

  const int dp = options.layout.dp;
  TpPlan plan;
  plan.tp = tp;
  plan.dp = dp;
  plan.ns_steps = options.ns_steps;
  for (TpModePlan* m : {&plan.owner, &plan.duplicated, &plan.blockwise}) {
    m->rank_ns_flops.assign(static_cast<size_t>(tp) * dp, 0);
    m->rank_tp_bytes.assign(static_cast<size_t>(tp) * dp, 0);
  }
  // Each dp index's TP-split matrices, in buffer order: the order every rank of its tp group
  // agrees on for AssignTpHomes.
  std::vector<std::vector<Matrix>> owned_split(dp);
  for (const PerBufferParamLayout& buffer : layout.buffers) {
    // Every bucket's grads reduce-scattered and params all-gathered over dp, each a ring moving
    // (dp - 1) shards out of every rank.
    const int64_t bytes_per_element =
        DTypeSize(buffer.key.grad_dtype) + DTypeSize(buffer.key.param_dtype);
    for (const Bucket& b : buffer.buckets) {
      plan.dp_bytes += static_cast<int64_t>(buffer.dp - 1) * b.shard_size * bytes_per_element;
    }
    for (const ParamPlacement& placement : buffer.params) {
      if (placement.role != ParamRole::kMuon) continue;
      const ParamSpec& p = params[placement.param_index];
      auto split = splits.find(p.name);
      ASSIGN_OR_RETURN(
          const Matrix m,
          DescribeMatrix(p, split == splits.end() ? FusedBlocks{} : split->second, options));
      const int d = buffer.OwnerOf(placement);
      if (m.split) {
        ++plan.tp_split_matrices;
        owned_split[d].push_back(m);
        for (int t = 0; t < tp; ++t) {
          const size_t r = static_cast<size_t>(d) * tp + t;
          plan.duplicated.rank_ns_flops[r] += m.global_flops;
          plan.duplicated.rank_tp_bytes[r] += (tp - 1) * m.shard_numel * options.update_bytes;
          plan.blockwise.rank_ns_flops[r] += m.local_flops;
        }
        continue;
      }
      ++plan.replicated_matrices;
      for (TpModePlan* mode : {&plan.owner, &plan.duplicated, &plan.blockwise}) {
        for (int t = 0; t < tp; ++t)
          mode->rank_ns_flops[static_cast<size_t>(d) * tp + t] += m.global_flops;
      }
    }
  }
  // Owner mode: homes within each dp index's tp group; a home receives and sends back tp - 1
  // shards, every other rank sends its shard and receives it back.
  for (int d = 0; d < dp; ++d) {
    std::vector<double> costs;
    for (const Matrix& m : owned_split[d]) costs.push_back(m.cost);
    const std::vector<int> homes = AssignTpHomes(costs, tp);
    for (size_t i = 0; i < homes.size(); ++i) {
      const Matrix& m = owned_split[d][i];
      for (int t = 0; t < tp; ++t) {
        const size_t r = static_cast<size_t>(d) * tp + t;
        if (t == homes[i]) {
          plan.owner.rank_ns_flops[r] += m.global_flops;
          plan.owner.rank_tp_bytes[r] += (tp - 1) * m.shard_numel * options.update_bytes;
        } else {
          plan.owner.rank_tp_bytes[r] += m.shard_numel * options.update_bytes;
        }
      }
    }
  }
  for (TpModePlan* m : {&plan.owner, &plan.duplicated, &plan.blockwise}) Summarise(m);
  return plan;
}

}  // namespace orthoshard::layout
