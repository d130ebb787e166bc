// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", arXiv:1711.05101) with the
// numerics of torch.optim.AdamW(foreach=False) in PyTorch 2.11: the same ATen ops in the same order,
// so fp32 results are bitwise equal on the same machine (proved by optimizers:oracle_test); or, with
// AdamWHyper::fused, those of torch.optim.AdamW(fused=True) (ATen's fused kernel).
//
//   step += 1
//   p *= 1 - lr * wd                                   (decoupled weight decay, when wd != 0)
//   m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
//   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
//
// AdamWUpdate is the per-tensor kernel, also used by the distributed optimizers on their shards. On
// large dense CPU tensors it runs the same float operations in two fused passes around ATen's sqrt
// (internal/fused_elementwise.h): same bits, about half the time.
#ifndef ORTHOSHARD_OPTIMIZERS_ADAMW_H_
#define ORTHOSHARD_OPTIMIZERS_ADAMW_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optimizers/slot_optimizer.h"

namespace orthoshard::optimizers {

struct AdamWHyper {
  double lr = 1e-3;            // base lr (multiplied by the schedule)
  double beta1 = 0.9;          // first-moment decay, in [0, 1)
  double beta2 = 0.999;        // second-moment decay, in [0, 1)
  double eps = 1e-8;           // added after the bias-corrected square root, >= 0
  double weight_decay = 0.01;  // decoupled, >= 0
  // The update by ATen's fused kernel (at::_fused_adamw_, one pass per tensor), called exactly as
  // torch.optim.AdamW(fused=True) calls it: its results are bitwise those of fused=True, not of
  // foreach=False (the kernel rounds the decay and the bias corrections in its own order). On the
  // CPU it is 3-4x faster than the default path (optimizers_benchmark, 256K-16M elements, 2
  // threads), but its scalar tail rounds some elements differently from its vector body, so an
  // element's result depends on where the tensor starts and how ATen chunks it over threads:
  // updating a ZeRO-1 slice of a param is not bitwise the same as updating the whole param (2 of
  // 800K elements differed at 1 thread, 6 at 2), and sharded runs then leave the single-process
  // reference by rounding. false (the default): torch.optim.AdamW(foreach=False)'s op order, the
  // same bits for any slice and thread count (with this project's bitwise-equal fused passes on
  // large CPU tensors).
  bool fused = false;
};

// Errors: kInvalidArgument naming the field, e.g. "AdamW: beta1 must be in [0, 1), got 1".
absl::Status ValidateAdamWHyper(const AdamWHyper& hp);

// Per-tensor state. Exported as "<name>/exp_avg", "<name>/exp_avg_sq", "<name>/step" (int64 scalar).
struct AdamWState {
  at::Tensor exp_avg;     // fp32, param's shape
  at::Tensor exp_avg_sq;  // fp32, param's shape
  int64_t step = 0;       // updates applied so far
};

// Zero state for an fp32 tensor like `param`.
AdamWState MakeAdamWState(const at::Tensor& param);

// One AdamW update of `param` in place with lr `lr` (hp.lr is ignored; callers pass the scheduled
// lr). Preconditions, not checked here (the AdamW class checks them at Create and SetGrad): param,
// grad and both moments are fp32 tensors of one shape; hp is valid. Advances state.step.
void AdamWUpdate(const at::Tensor& param, const at::Tensor& grad, AdamWState& state,
                 const AdamWHyper& hp, double lr);

// AdamW over slots: any param, or any element range of one (AdamW is elementwise, so a ZeRO-1
// rank's slice of a param straddling ranks updates exactly as the whole would). State per slot:
// "<name>/exp_avg", "<name>/exp_avg_sq" (fp32), "<name>/step" (int64 counter) and, for bf16
// params, "<name>/main_param".
class AdamW final : public SlotOptimizer {
 public:
  struct Entry {
    Slot slot;
    AdamWHyper hp;
  };
  // Errors: kInvalidArgument for invalid hyperparameters, a slot SlotOptimizer rejects, or a
  // duplicate param name ("duplicate param name 'w'").
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(std::vector<Entry> entries);

  absl::string_view kind() const override { return "adamw"; }
  std::vector<std::string> FieldNames() const override;

 private:
  AdamW() = default;
  void Update(size_t i, const at::Tensor& grad, double lr_multiplier) override;
  std::vector<Field> Fields(size_t i) const override;
  void SetCounter(size_t i, absl::string_view field, int64_t value) override;

  std::vector<AdamWHyper> hps_;     // per slot
  std::vector<AdamWState> states_;  // per slot
};

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_ADAMW_H_
