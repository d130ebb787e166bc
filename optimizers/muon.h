// Muon (Jordan et al., https://kellerjordan.github.io/posts/muon/) with the numerics of
// torch.optim.Muon in PyTorch 2.11 (torch/optim/_muon.py), plus the options Megatron-LM adds:
// configurable Newton–Schulz dtype, Megatron's "spectral" lr scale, and fused weights (QKV, SwiGLU
// gate/up) orthogonalised per logical block.
//
//   B = lerp(B, g, 1 - mu)                    (B = mu B + (1 - mu) g)
//   U = lerp(g, B, mu) if nesterov else B     (g + mu (B - g))
//   O = NS(U) per logical block               (see NewtonSchulz)
//   p *= 1 - lr * wd                          (weight decay with the unadjusted lr)
//   p -= lr * scale(rows, cols) * O           (scale per block shape, see MuonLrScale)
//
// With bf16 Newton–Schulz, default coefficients and no split, MuonUpdate is op for op PyTorch's
// `_single_tensor_muon`, hence bitwise equal on the same machine (optimizers:oracle_test); on dense
// CPU tensors its elementwise ops run as two fused passes with the same float operations
// (internal/fused_elementwise.h).
#ifndef ORTHOSHARD_OPTIMIZERS_MUON_H_
#define ORTHOSHARD_OPTIMIZERS_MUON_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "optimizers/kinds.h"
#include "optimizers/ns_schedule.h"
#include "optimizers/slot_optimizer.h"

namespace orthoshard::optimizers {

struct NewtonSchulzOptions {
  // The coefficient schedule: iteration i uses coefficients[min(i, size - 1)], so one triple is
  // the classic fixed iteration (PyTorch's default below) and a list is a per-iteration schedule
  // such as Polar Express (ns_schedule.h). Non-empty; coefficients within +-kMaxNsCoefficient
  // that keep the iterate's singular values within kMaxNsSingularValue (CheckNsScheduleBounded).
  std::vector<NsCoefficients> coefficients = {{3.4445, -4.7750, 2.0315}};
  // Iteration i uses coefficients[i % size] instead: the table restarts after its last triple
  // (Megatron-LM's quintic and aol). ns_steps must then be a multiple of the table's size.
  bool cycle = false;
  int ns_steps = 5;                     // iterations, in [1, 100)
  double eps = 1e-7;                    // the Frobenius norm is clamped at eps before dividing
  // X is divided by max(norm_scale * ||X||_F, eps): a margin > 1 keeps every singular value
  // safely below 1 in a low-precision norm (Polar Express's 1.02). 1: exactly torch.optim.Muon's
  // normalisation, op for op.
  double norm_scale = 1.0;
  NsDType dtype = NsDType::kBFloat16;   // dtype the iteration runs in
  // Orthogonalise the matrices of one step that have the same shape and options (whole params or
  // blocks of fused ones, across slots) together, as one batched iteration (bmm / baddbmm) instead
  // of one per matrix (Megatron-LM's batched Newton–Schulz). Same arithmetic, possibly other
  // kernels: results agree with the per-matrix iteration within NewtonSchulz's rounding (bitwise
  // where the batched GEMM runs the per-matrix kernel, as on CPU). Several times faster for
  // GPT-sized matrices on a GPU; about even on a CPU. Costs one copy of the step's NS inputs.
  bool batched = false;
  // Run the iteration on the Gram matrix where that takes fewer FLOPs (GramNewtonSchulzSavesWork:
  // the long side at least twice the short one, e.g. an MLP's [4h, h] matrices). For X [m, n],
  // m <= n, X_{k+1} = p(A_k) X_k with A_k = X_k X_k^T and p(A) = aI + bA + cA^2, so X_k = Q_k X_0
  // with Q_{k+1} = p(A_k) Q_k, and A_{k+1} = p(A_k) A_k p(A_k) = p(A_k)^2 A_k (p(A_k) is a
  // polynomial in A_k: symmetric, commuting with it). Only the first A_0 = X_0 X_0^T and the last
  // Q_s X_0 touch the long side; every step in between is [m, m] products: 4 m^2 n + 2 m^3 (4s - 3)
  // FLOPs against s (4 m^2 n + 2 m^3), about 30% fewer for [4h, h] at s = 5. The same iteration in
  // exact arithmetic; in floating point A_k is carried instead of recomputed, so rounding is not
  // corrected between steps: it restarts from X = Q X_0 every kGramRestart steps, and it is
  // offered for the fp32 iteration only (ValidateMuonHyper). Results agree with the direct form
  // within fp32 rounding amplified by the iteration (optimizers_test derives the bound); not
  // bitwise equal to torch.optim.Muon. Shapes where it saves nothing run the direct form.
  bool gram = false;
};

// Steps of the Gram form between restarts from the iterate (NewtonSchulzOptions::gram): PyTorch's
// default 5 steps run without one.
inline constexpr int kGramRestart = 5;

// Whether the Gram form takes fewer FLOPs than the direct one for an [m, n] matrix (either
// orientation) over `steps` steps: the long side at least twice the short one and steps >= 2.
bool GramNewtonSchulzSavesWork(int64_t rows, int64_t cols, int steps);

// The iteration of `options` (coefficients, steps; not the normalisation) on x [m, n] or a stack
// [k, m, n] with m <= n, already normalised, in x's dtype (any floating type): the direct form
// (torch.optim.Muon's) and the Gram form. Exposed for tests of the two forms' agreement.
at::Tensor NsIterateDirect(at::Tensor x, const NewtonSchulzOptions& options);
at::Tensor NsIterateGram(at::Tensor x, const NewtonSchulzOptions& options);

struct MuonHyper {
  double lr = 1e-3;           // base lr (multiplied by the schedule)
  double weight_decay = 0.1;  // decoupled, applied with the unadjusted lr, >= 0
  double momentum = 0.95;     // mu, in [0, 1)
  bool nesterov = true;
  NewtonSchulzOptions ns;
  MuonScaleRule scale_rule = MuonScaleRule::kOriginal;
  double extra_scale = 1.0;   // kSpectral only, > 0
};

// Errors: kInvalidArgument naming the field, e.g. "Muon: ns_steps must be in [1, 100), got 0", or
// the Newton-Schulz iteration whose coefficients let singular values leave [0, 16].
absl::Status ValidateMuonHyper(const MuonHyper& hp);

// Sets ns->coefficients, ns->norm_scale and ns->cycle from a schedule name or list
// (ParseNsSchedule).
absl::Status SetNsSchedule(absl::string_view schedule, NewtonSchulzOptions* ns);

// Approximately orthogonalises the 2-D `g` (US'V^T with S' near 1 for G = USV^T): normalises a copy
// in options.dtype by its Frobenius norm (clamped at eps), works on the transpose when rows > cols
// so the Gram matrix is the small one, and runs the quintic iteration. Returns a tensor of g's shape
// in options.dtype; `g` is not modified. Precondition: g is 2-D floating point.
at::Tensor NewtonSchulz(const at::Tensor& g, const NewtonSchulzOptions& options);

// NewtonSchulz of each matrix of the stack `g` [k, rows, cols] as one batched iteration (see
// NewtonSchulzOptions::batched); returns [k, rows, cols] in options.dtype. `g` is not modified.
at::Tensor NewtonSchulzBatched(const at::Tensor& g, const NewtonSchulzOptions& options);

// One matrix for OrthogonalizeBlocks: its logical blocks (`split`) are orthogonalised with `ns`.
struct NsJob {
  at::Tensor matrix;                    // 2-D, any floating dtype; not modified
  const FusedSplit* split = nullptr;    // empty or null: one matrix
  const NewtonSchulzOptions* ns = nullptr;
};

// NewtonSchulz of every logical block of every job, result[k][j] for block j of job k (in
// FusedSplit order), each in its options' dtype. Blocks of one shape and the same options across
// jobs go through one NewtonSchulzBatched when those options ask for batching (in job order),
// else one NewtonSchulz each: what Muon's step runs, so callers that orthogonalise the same
// matrices in the same groups get the same bits.
std::vector<std::vector<at::Tensor>> OrthogonalizeBlocks(absl::Span<const NsJob> jobs);

// The factor applied to lr for a [rows, cols] matrix under hp.scale_rule.
double MuonLrScale(int64_t rows, int64_t cols, const MuonHyper& hp);

// One Muon update with lr `lr` (hp.lr is ignored; callers pass the scheduled lr). `param`, `grad`
// and `momentum_buffer` are fp32 of one 2-D shape; `split` has been validated against it. The
// momentum and Nesterov steps act on the whole tensor; Newton–Schulz and the lr scale act per block.
void MuonUpdate(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum_buffer,
                const MuonHyper& hp, double lr, const FusedSplit& split);

// Muon over slots that each cover a whole 2-D matrix (a single process's params, or the matrices a
// layer-wise rank owns). State per slot: "<name>/momentum_buffer" (fp32) and, for bf16 params,
// "<name>/main_param".
//
// Tensor parallelism (optimizers/tp_muon.h): a slot whose Slot::tp is split holds its tp-local
// slice; its Entry::split describes the GLOBAL matrix. With a TpNewtonSchulz the slice's
// Newton–Schulz runs on the global matrix through it (MuonTpMode kOwner / kDuplicated: bitwise
// single-process Muon on the global matrix); without one, blockwise (the slice as a whole matrix,
// TpLocalFusedSplit, the slice's lr scale: MuonTpMode::kBlockwise).
class TpNewtonSchulz;

class Muon final : public SlotOptimizer {
 public:
  struct Entry {
    Slot slot;
    MuonHyper hp;
    FusedSplit split;  // logical blocks of a fused weight (the global one if split over tp)
  };
  // `tp_ns` (may be null; must outlive the optimizer) orthogonalises the slots split over tp; it is
  // Prepare-d here with them, in entry order. Errors: kInvalidArgument for invalid
  // hyperparameters, a slot that is not 2-D ("param 'b': Muon needs a 2-D matrix, got shape [8]")
  // or only a part of its param, an invalid split (of the global matrix for a split slot; for
  // blockwise also one whose slice holds no whole blocks), a duplicate name, a slot SlotOptimizer
  // rejects, or tp_ns->Prepare's.
  static absl::StatusOr<std::unique_ptr<Muon>> Create(std::vector<Entry> entries,
                                                      TpNewtonSchulz* tp_ns = nullptr);

  absl::string_view kind() const override { return "muon"; }
  std::vector<std::string> FieldNames() const override;

  // Newton–Schulz cost of one step over this optimizer's slots, in the layout's units: max(m, n) x
  // min(m, n)^2 per logical matrix (each block of a fused split), summed; for how evenly the
  // orthogonalisation work is spread over ranks. Split slots count as the TpNewtonSchulz says
  // (ns_cost: the global matrices homed here, or all of them), or their slices' blocks (blockwise).
  double ns_cost() const;

 private:
  Muon() = default;
  void Update(size_t i, const at::Tensor& grad, double lr_multiplier) override;
  // Batched Newton–Schulz when a slot asks for it (NewtonSchulzOptions::batched), else per slot;
  // split slots through the TpNewtonSchulz (one Orthogonalize call for all of `indices`'). Errors:
  // its.
  absl::Status UpdateSlots(absl::Span<const int64_t> indices, const StepContext& context) override;
  std::vector<Field> Fields(size_t i) const override;
  void SetCounter(size_t, absl::string_view, int64_t) override {}

  std::vector<MuonHyper> hps_;           // per slot
  std::vector<FusedSplit> splits_;       // per slot (of the slice for a blockwise split slot)
  TpNewtonSchulz* tp_ns_ = nullptr;
  std::vector<int> tp_index_;            // per slot: index in tp_ns_'s matrices, or -1
  std::vector<std::vector<int64_t>> global_shapes_;  // per slot: the global matrix's shape
  std::vector<at::Tensor> momentum_;     // per slot: fp32, the param's shape
};

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_MUON_H_
