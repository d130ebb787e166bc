// Muon for matrices split over the tensor-parallel group (common/tp_split.h): the interface through
// which Muon hands the Newton–Schulz of its split slots to whoever can see the other tp ranks'
// slices (optimizers/distributed implements it over the tp Communicator; nothing here
// communicates), and the shape arithmetic both sides share.
//
// Muon's update of a split slot: momentum and Nesterov on the local slice (elementwise, as for a
// whole matrix), then the slice U of the Newton–Schulz input goes to a TpNewtonSchulz, which
// returns this rank's slice of NS(U_global) computed per logical block of the GLOBAL FusedSplit;
// the param update then scales each row by MuonLrScale of its global block's shape. Every step is
// elementwise except Newton–Schulz, which runs on the assembled global matrix exactly as a single
// process runs it, so the result is bitwise single-process Muon on the global matrix. Without a
// TpNewtonSchulz a split slot is orthogonalised blockwise (MuonTpMode::kBlockwise): its slice as
// a whole matrix with the slice's FusedSplit (TpLocalFusedSplit) and the slice's lr scale.
#ifndef ORTHOSHARD_OPTIMIZERS_TP_MUON_H_
#define ORTHOSHARD_OPTIMIZERS_TP_MUON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tp_split.h"
#include "optimizers/muon.h"
#include "optimizers/slot_optimizer.h"

namespace orthoshard::optimizers {

// A TP-split matrix Muon steps, as every rank of its tp group describes it.
struct TpNsMatrix {
  std::string name;
  std::vector<int64_t> global_shape;  // [rows, cols] of the whole matrix
  TpSplit tp;                         // this rank's split (rank = its tp rank)
  FusedSplit split;                   // logical blocks of the GLOBAL matrix; empty: one matrix
  NewtonSchulzOptions ns;
};

// Newton–Schulz of TP-split matrices across their tp group.
// Cross-rank contract: the tp group's ranks give Prepare the same matrices in the same order (their
// layouts are one, computed from the tp-local shapes) and call Orthogonalize with the same matrix
// indices in the same order, the same number of times (Muon does, one call per step or stage that
// updates a split slot; a skipped step calls nothing on any rank).
class TpNewtonSchulz {
 public:
  virtual ~TpNewtonSchulz() = default;
  // The matrices this rank will orthogonalise (called once, by Muon::Create). Errors:
  // kInvalidArgument for a matrix whose split does not fit the tp group.
  virtual absl::Status Prepare(std::vector<TpNsMatrix> matrices) = 0;
  // This rank's Newton–Schulz cost per step over the prepared matrices (TpNsCost units).
  virtual double ns_cost() const = 0;
  // inputs: (index into Prepare's list, this rank's slice of the NS input: the local shape, in the
  // NS dtype, contiguous). Returns, per input, this rank's slice of the global matrix with every
  // logical block orthogonalised (NewtonSchulz, batched over same-shape blocks when ns.batched),
  // local shape, NS dtype. Errors: the collective's (the job must stop).
  virtual absl::StatusOr<std::vector<at::Tensor>> Orthogonalize(
      absl::Span<const std::pair<int, at::Tensor>> inputs) = 0;
};

// Newton–Schulz cost of a [rows, cols] matrix with logical blocks `split`: max(m, n) min(m, n)^2
// per block (the layout's cost model, layout/metrics.h).
double NsCost(int64_t rows, int64_t cols, const FusedSplit& split);

// The FusedSplit of the tp-local slice of a matrix whose global split is `global` (blockwise
// Newton–Schulz): dim 1 keeps it; dim 0 with 1 part takes num_groups / size groups (QKV's KV
// groups); dim 0 with `parts` parts needs one group of `parts` blocks, each cut by size (fc1's
// gate and up). Errors: kInvalidArgument naming `name` when the slice does not hold whole blocks.
absl::StatusOr<FusedSplit> TpLocalFusedSplit(const FusedSplit& global, const TpSplit& tp,
                                             const std::string& name);

// The global matrix from every tp rank's slice (`slices[r]` is rank r's, local shape), placed at
// the runs TpRuns gives each rank; contiguous, in the slices' dtype.
at::Tensor AssembleTpMatrix(absl::Span<const at::Tensor> slices, const TpSplit& tp,
                            const std::vector<int64_t>& global_shape);
// Rank tp.rank's slice of `global` (contiguous, local shape).
at::Tensor TpSliceOf(const at::Tensor& global, const TpSplit& tp);

// `matrix` with every logical block of `split` orthogonalised: the blocks of a list of matrices
// go through OrthogonalizeBlocks and come back assembled into one tensor of each matrix's shape.
std::vector<at::Tensor> OrthogonalizeWhole(absl::Span<const NsJob> jobs);

// Muon's param update of a split slot from its slice `ortho` of the orthogonalised global matrix:
// decoupled weight decay, then each local row added with lr times the lr scale of the global
// logical block it belongs to.
void ApplyTpOrtho(const at::Tensor& param, const at::Tensor& ortho, const MuonHyper& hp, double lr,
                  const TpSplit& tp, const std::vector<int64_t>& global_shape,
                  const FusedSplit& global_split);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_TP_MUON_H_
