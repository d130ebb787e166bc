// Muon's Newton–Schulz of TP-split matrices over the tp group's Communicator (the TpNewtonSchulz
// of optimizers/tp_muon.h), in MuonTpMode kOwner or kDuplicated:
//
//   kOwner       every prepared matrix gets one home tp rank (layout::AssignTpHomes over NsCost of
//                the global matrices, in Prepare order: the same homes on every tp rank). Each call
//                sends every slice to its matrix's home in ONE all-to-all (uneven splits, flat in
//                the NS dtype); the home assembles each matrix (AssembleTpMatrix), orthogonalises
//                them (OrthogonalizeBlocks: batched over same-shape blocks when ns.batched), and a
//                second all-to-all returns each rank its slices. Newton–Schulz work per tp rank:
//                about 1/tp of the matrices'.
//   kDuplicated  Megatron-LM's: ONE all-gather of every slice, every tp rank assembles and
//                orthogonalises every matrix and keeps its slices (tp times the work).
//
// Both run the same Newton–Schulz on the same assembled matrices, so they return the same bits,
// and those of single-process Muon on the global matrix (with ns.batched, as long as the same
// matrices share a batch: single-process batches every same-shape matrix of the step, a home only
// its own, so bitwise only where the batched kernel rounds like the per-matrix one, as on CPU).
#ifndef ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TP_NEWTON_SCHULZ_H_
#define ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TP_NEWTON_SCHULZ_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "optimizers/kinds.h"
#include "optimizers/tp_muon.h"

namespace orthoshard::optimizers::distributed {

class CollectiveTpNewtonSchulz final : public TpNewtonSchulz {
 public:
  // `tp` (must outlive it) is this rank's tp group; `mode` kOwner or kDuplicated. Errors:
  // kInvalidArgument for a null communicator or kBlockwise (which needs none: Muon without a
  // TpNewtonSchulz).
  static absl::StatusOr<std::unique_ptr<CollectiveTpNewtonSchulz>> Create(
      collectives::Communicator* tp, MuonTpMode mode);

  // Errors: kInvalidArgument for a matrix whose TpSplit is not over this tp group (size and rank
  // of the communicator) or whose global shape is not 2-D.
  absl::Status Prepare(std::vector<TpNsMatrix> matrices) override;
  double ns_cost() const override;
  absl::StatusOr<std::vector<at::Tensor>> Orthogonalize(
      absl::Span<const std::pair<int, at::Tensor>> inputs) override;

  // The home tp rank of each prepared matrix (kOwner; every rank for kDuplicated: -1).
  const std::vector<int>& homes() const { return homes_; }

 private:
  CollectiveTpNewtonSchulz(collectives::Communicator* tp, MuonTpMode mode) : tp_(tp), mode_(mode) {}
  absl::StatusOr<std::vector<at::Tensor>> Owner(absl::Span<const std::pair<int, at::Tensor>> in);
  absl::StatusOr<std::vector<at::Tensor>> Duplicated(
      absl::Span<const std::pair<int, at::Tensor>> in);

  collectives::Communicator* tp_;
  MuonTpMode mode_;
  std::vector<TpNsMatrix> matrices_;
  std::vector<double> costs_;  // NsCost of each global matrix
  std::vector<int> homes_;
};

}  // namespace orthoshard::optimizers::distributed

#endif  // ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TP_NEWTON_SCHULZ_H_
