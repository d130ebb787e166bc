// The planning table for Muon under tensor parallelism: for a model's tp-local params on a tp x dp
// grid, how many Newton–Schulz FLOPs each rank runs per step and how many bytes it moves for Muon
// over its tp group, under each of the three ways of orthogonalising a TP-split matrix
// (--muon_tp_mode):
//
//   owner       each TP-split matrix has one home in the tp group of its dp owners (AssignTpHomes,
//               balanced by max(m,n)·min(m,n)² over the GLOBAL logical matrices, the cost the
//               optimizer balances with); the home gathers the tp shards, runs Newton–Schulz once
//               on the whole matrix and scatters the shards back.
//   duplicated  (Megatron) every tp rank of the owners' group all-gathers the matrix and runs
//               Newton–Schulz on all of it, keeping its own shard: tp× the FLOPs, no scatter.
//   blockwise   (Megatron) each rank runs Newton–Schulz on its local shard's logical matrices; no
//               communication, but the update changes with tp.
//
// Params not split by tp (the MoE router, when routed to Muon) are orthogonalised whole by their
// dp owner on every tp rank, in every mode. The dp traffic (grad reduce-scatter, param all-gather
// over the tp-local buffers) is the same in all three modes and reported once.
//
// FLOPs are the matrix products of the direct iteration (optimizers/muon.cc NsIterateDirect) on X
// [m, n], m = min(rows, cols) (NewtonSchulz transposes a tall matrix), 2 FLOPs per multiply-add:
//   A = X Xᵀ              [m, n]·[n, m]   2 m² n
//   B = b A + c A·A       [m, m]·[m, m]   2 m³
//   X' = a X + B X        [m, m]·[m, n]   2 m² n
// so 4 m² n + 2 m³ per step and ns_steps (4 m² n + 2 m³) per matrix. The normalisation (one norm
// and one division, O(m n)) and the scalings are left out; the Gram form
// (NewtonSchulzOptions::gram, off by default) is not modelled. Batching same-shape matrices
// changes no FLOP count.
//
// Pure: params in, figures out; no tensors, no communicator.
#ifndef ORTHOSHARD_LAYOUT_TP_PLAN_H_
#define ORTHOSHARD_LAYOUT_TP_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tp_split.h"
#include "layout/fused_blocks.h"
#include "layout/layout.h"

namespace orthoshard::layout {

// Muon's ways of orthogonalising a TP-split matrix (see the file comment).
enum class TpMuonMode { kOwner, kDuplicated, kBlockwise };
inline constexpr TpMuonMode kTpMuonModes[] = {TpMuonMode::kOwner, TpMuonMode::kDuplicated,
                                              TpMuonMode::kBlockwise};
const char* TpMuonModeName(TpMuonMode mode);  // "owner", "duplicated", "blockwise"

struct TpPlanOptions {
  int tp = 1;  // tensor-parallel size; every split param's TpSplit::size must equal it
  // The layout the trainer plans over the tp-local params: layout.dp is the dp size. Expert params
  // are planned over the same dp (expert_dp 0 or dp: one expert-parallel group, ep 1). Muon needs
  // whole matrices, so muon_strategy is layerwise or megatron_lpt.
  LayoutOptions layout;
  int ns_steps = 5;  // Newton–Schulz iterations, in [1, 100) (MuonHyper's default)
  // Bytes per element of the update moved over the tp group (gather to a home, scatter back,
  // all-gather): 4, the fp32 momentum-updated gradient and orthogonalised update. >= 1.
  int64_t update_bytes = 4;
};

// One mode's figures over the grid. Rank index d * tp + t: tp innermost, as the mesh numbers
// ranks (collectives/mesh.h).
struct TpModePlan {
  std::vector<int64_t> rank_ns_flops;  // [tp * dp] Newton–Schulz FLOPs per step
  // [tp * dp] bytes sent over the tp group per step for Muon; each rank receives as many as it
  // sends, in every mode.
  std::vector<int64_t> rank_tp_bytes;
  int64_t total_ns_flops = 0;          // over the grid
  int64_t max_ns_flops = 0;
  double mean_ns_flops = 0;
  double ns_imbalance = 1;             // max / mean (1 when nothing runs)
  int64_t max_tp_bytes = 0;
  double mean_tp_bytes = 0;
};

struct TpPlan {
  int tp = 1;
  int dp = 1;
  int ns_steps = 5;
  TpModePlan owner, duplicated, blockwise;
  // Bytes each rank sends per step over its dp groups (ring reduce-scatter of every bucket's grads
  // in the grad dtype, ring all-gather of its params in the param dtype: (dp - 1) · shard_size
  // elements each), the same in every mode and for every rank.
  int64_t dp_bytes = 0;
  int tp_split_matrices = 0;   // Muon params split by tp (owner mode gives each a home)
  int replicated_matrices = 0;  // Muon params every tp rank holds whole

  const TpModePlan& mode(TpMuonMode m) const;
};

// Newton–Schulz FLOPs of one [rows, cols] matrix: ns_steps · (4 m² n + 2 m³), m = min, n = max.
int64_t NsFlops(int64_t rows, int64_t cols, int ns_steps);

// The logical matrices of a tp rank's slice of a fused weight whose global blocks are `global`:
// split along dim 1 (row-parallel), the same blocks; along dim 0 with one part and num_groups
// divisible by split.size, num_groups / size groups of the same blocks (QKV by KV groups); with
// num_groups 1 and one part per block of equal rows, each block's rows / size (fc1's gate and up).
// Errors: kInvalidArgument naming `what` when a slice does not hold whole logical matrices.
absl::StatusOr<FusedBlocks> TpLocalBlocks(const FusedBlocks& global, const TpSplit& split,
                                          const std::string& what);

// Plans `params` (tp-local shapes, forward order, each ParamSpec::tp as in common/tp_split.h) with
// the fused weights' GLOBAL logical matrices `splits` (by param name; absent: one matrix) on the
// tp x options.layout.dp grid.
// Errors: kInvalidArgument for tp outside 1..2^20, ns_steps outside [1, 100), update_bytes < 1,
// expert_dp other than 0 or dp, muon_strategy distopt ("Muon needs whole matrices"), a split param
// whose TpSplit::size is not tp, a split that does not fit its global shape (ValidateTpSplit), a
// fused split that does not fit its param's rows or whose tp slices do not hold whole logical
// matrices, a split named for a param that is absent or not a Muon param; and every error of
// ComputeFullParamLayout.
absl::StatusOr<TpPlan> PlanTpMuon(const std::vector<ParamSpec>& params,
                                  const std::map<std::string, FusedBlocks>& splits,
                                  const TpPlanOptions& options);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_TP_PLAN_H_
