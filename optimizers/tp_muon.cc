#include "optimizers/tp_muon.h"

#include <algorithm>
#include <utility>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"

namespace orthoshard::optimizers {

double NsCost(int64_t rows, int64_t cols, const FusedSplit& split) {
  const double c = static_cast<double>(cols);
  std::vector<double> block_rows;
  if (split.block_rows.empty()) {
    block_rows.push_back(static_cast<double>(rows));
  } else {
    for (int64_t r : split.block_rows) {
      block_rows.push_back(static_cast<double>(r * split.num_groups));
    }
  }
  double cost = 0.0;
  for (double m : block_rows) cost += std::max(m, c) * std::min(m, c) * std::min(m, c);
  return cost;
}

absl::StatusOr<FusedSplit> TpLocalFusedSplit(const FusedSplit& global, const TpSplit& tp,
                                             const std::string& name) {
  if (global.block_rows.empty() || tp.dim != 0 || !tp.split()) return global;
  if (tp.parts == 1) {
    if (global.num_groups % tp.size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", name, "': fused split of ", global.num_groups,
          " groups cannot be cut into ", tp.size, " tp slices of whole groups"));
    }
    return FusedSplit{global.num_groups / tp.size, global.block_rows};
  }
  const bool whole_parts =
      global.num_groups == 1 && static_cast<int64_t>(global.block_rows.size()) == tp.parts &&
      std::all_of(global.block_rows.begin(), global.block_rows.end(), [&](int64_t r) {
        return r == global.block_rows.front() && r % tp.size == 0;
      });
  if (!whole_parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': split over tp in ", tp.parts,
        " parts needs a fused split of one group of ", tp.parts, " equal blocks divisible by ",
        tp.size, " (fc1's gate and up)"));
  }
  FusedSplit local = global;
  for (int64_t& r : local.block_rows) r /= tp.size;
  return local;
}

at::Tensor AssembleTpMatrix(absl::Span<const at::Tensor> slices, const TpSplit& tp,
                            const std::vector<int64_t>& global_shape) {
  at::Tensor global = at::empty(global_shape, slices.front().options());
  const int64_t extent = global_shape[tp.dim];
  for (int r = 0; r < tp.size; ++r) {
    int64_t cursor = 0;
    for (const auto& [begin, end] : TpRuns(extent, tp.ForRank(r))) {
      global.narrow(tp.dim, begin, end - begin)
          .copy_(slices[r].narrow(tp.dim, cursor, end - begin));
      cursor += end - begin;
    }
  }
  return global;
}

at::Tensor TpSliceOf(const at::Tensor& global, const TpSplit& tp) {
  std::vector<at::Tensor> pieces;
  for (const auto& [begin, end] : TpRuns(global.size(tp.dim), tp)) {
    pieces.push_back(global.narrow(tp.dim, begin, end - begin));
  }
  return at::cat(pieces, tp.dim).contiguous();
}

std::vector<at::Tensor> OrthogonalizeWhole(absl::Span<const NsJob> jobs) {
  const std::vector<std::vector<at::Tensor>> orthos = OrthogonalizeBlocks(jobs);
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < jobs.size(); ++k) {
    const at::Tensor& m = jobs[k].matrix;
    if (orthos[k].size() == 1) {
      out.push_back(orthos[k][0]);
      continue;
    }
    // Blocks back into their rows: [G, sum(block_rows), cols], block j at its row offset.
    const FusedSplit& split = *jobs[k].split;
    const int64_t groups = split.num_groups;
    const int64_t cols = m.size(1);
    at::Tensor whole = at::empty({groups, m.size(0) / groups, cols}, orthos[k][0].options());
    int64_t offset = 0;
    for (size_t j = 0; j < orthos[k].size(); ++j) {
      const int64_t r = split.block_rows[j];
      whole.narrow(1, offset, r).copy_(orthos[k][j].reshape({groups, r, cols}));
      offset += r;
    }
    out.push_back(whole.view({m.size(0), cols}));
  }
  return out;
}

void ApplyTpOrtho(const at::Tensor& param, const at::Tensor& ortho, const MuonHyper& hp, double lr,
                  const TpSplit& tp, const std::vector<int64_t>& global_shape,
                  const FusedSplit& global_split) {
  // The global row of each local row: the runs this rank holds (dim 0), or the rows themselves.
  const int64_t local_rows = param.size(0);
  std::vector<int64_t> global_row;
  global_row.reserve(local_rows);
  if (tp.dim == 0) {
    for (const auto& [begin, end] : TpRuns(global_shape[0], tp)) {
      for (int64_t g = begin; g < end; ++g) global_row.push_back(g);
    }
  } else {
    for (int64_t g = 0; g < local_rows; ++g) global_row.push_back(g);
  }
  // The logical block of a global row, and that block's rows (its lr scale's shape).
  const int64_t group_rows = global_split.block_rows.empty()
                                 ? global_shape[0]
                                 : global_shape[0] / global_split.num_groups;
  auto block_of = [&](int64_t g) -> int {
    if (global_split.block_rows.empty()) return 0;
    int64_t within = g % group_rows;
    int j = 0;
    while (within >= global_split.block_rows[j]) within -= global_split.block_rows[j++];
    return j;
  };
  auto block_rows = [&](int j) -> int64_t {
    return global_split.block_rows.empty() ? global_shape[0]
                                           : global_split.num_groups * global_split.block_rows[j];
  };
  // As ApplyOrthos: p *= 1 - lr wd, then p += (-lr scale) O per run of rows of one block: the
  // same elementwise operations as the single-process update of the global matrix.
  param.mul_(1.0 - lr * hp.weight_decay);
  int64_t run_begin = 0;
  while (run_begin < local_rows) {
    const int j = block_of(global_row[run_begin]);
    int64_t run_end = run_begin + 1;
    while (run_end < local_rows && block_of(global_row[run_end]) == j) ++run_end;
    const double adjusted_lr = lr * MuonLrScale(block_rows(j), global_shape[1], hp);
    param.narrow(0, run_begin, run_end - run_begin)
        .add_(ortho.narrow(0, run_begin, run_end - run_begin), -adjusted_lr);
    run_begin = run_end;
  }
}

}  // namespace orthoshard::optimizers
