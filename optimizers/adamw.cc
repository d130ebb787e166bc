#include "optimizers/adamw.h"

#include <cmath>
#include <utility>

#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "optimizers/internal/fused_elementwise.h"

namespace orthoshard::optimizers {

absl::Status ValidateAdamWHyper(const AdamWHyper& hp) {
  if (!(hp.lr >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW: lr must be >= 0, got ", hp.lr));
  }
  if (!(hp.beta1 >= 0.0 && hp.beta1 < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: beta1 must be in [0, 1), got ", hp.beta1));
  }
  if (!(hp.beta2 >= 0.0 && hp.beta2 < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: beta2 must be in [0, 1), got ", hp.beta2));
  }
  if (!(hp.eps >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW: eps must be >= 0, got ", hp.eps));
  }
  if (!(hp.weight_decay >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: weight_decay must be >= 0, got ", hp.weight_decay));
  }
  return absl::OkStatus();
}

AdamWState MakeAdamWState(const at::Tensor& param) {
  AdamWState s;
  s.exp_avg = at::zeros_like(param, param.options().dtype(at::kFloat));
  s.exp_avg_sq = at::zeros_like(param, param.options().dtype(at::kFloat));
  return s;
}

void AdamWUpdate(const at::Tensor& param, const at::Tensor& grad, AdamWState& state,
                 const AdamWHyper& hp, double lr) {
  // Op for op torch/optim/adam.py `_single_tensor_adam` (decoupled_weight_decay=True, no amsgrad,
  // not capturable): scalars are computed in double exactly as Python does, then handed to the same
  // ATen kernels.
  state.step += 1;
  if (hp.fused) {
    // As torch/optim/adam.py `_fused_adam` (decoupled weight decay): the step count is a float32
    // tensor incremented by 1 before the call (exact below 2^24 steps); lr, betas, weight decay and
    // eps are passed as doubles; no amsgrad, grad scale or found_inf.
    const at::Tensor step = at::full({}, static_cast<float>(state.step),
                                     param.options().dtype(at::kFloat));
    at::_fused_adamw_({param}, {grad}, {state.exp_avg}, {state.exp_avg_sq}, {}, {step}, lr,
                      hp.beta1, hp.beta2, hp.weight_decay, hp.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
    return;
  }
  const double step = static_cast<double>(state.step);
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
  if (param.numel() >= internal::kFusedAdamWMinNumel &&
      internal::CanFuseAdamW(param, grad, state.exp_avg, state.exp_avg_sq, hp.beta1)) {
    // Large dense CPU tensors: the same ops in fewer trips through memory, bitwise equal to the
    // ATen ops below (internal/fused_elementwise.h).
    internal::AdamWScalars s;
    s.apply_decay = hp.weight_decay != 0.0;
    s.decay = 1.0 - lr * hp.weight_decay;
    s.beta1 = hp.beta1;
    s.beta2 = hp.beta2;
    s.bias_correction2_sqrt = bias_correction2_sqrt;
    s.eps = hp.eps;
    s.step_size = step_size;
    internal::FusedAdamW(param, grad, state.exp_avg, state.exp_avg_sq, s);
    return;
  }
  if (hp.weight_decay != 0.0) param.mul_(1.0 - lr * hp.weight_decay);
  state.exp_avg.lerp_(grad, 1.0 - hp.beta1);
  state.exp_avg_sq.mul_(hp.beta2).addcmul_(grad, grad, 1.0 - hp.beta2);
  at::Tensor denom = at::div(state.exp_avg_sq.sqrt(), bias_correction2_sqrt).add_(hp.eps);
  param.addcdiv_(state.exp_avg, denom, -step_size);
}

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(std::vector<Entry> entries) {
  std::unique_ptr<AdamW> opt(new AdamW());
  for (Entry& e : entries) {
    RETURN_IF_ERROR(ValidateAdamWHyper(e.hp));
    RETURN_IF_ERROR(opt->Add(std::move(e.slot)));
    opt->hps_.push_back(e.hp);
    opt->states_.push_back(MakeAdamWState(opt->slots_.back().main));
  }
  return opt;
}

std::vector<std::string> AdamW::FieldNames() const {
  return {"exp_avg", "exp_avg_sq", "step", "main_param"};
}

void AdamW::Update(size_t i, const at::Tensor& grad, double lr_multiplier) {
  AdamWUpdate(slots_[i].main, grad, states_[i], hps_[i], hps_[i].lr * lr_multiplier);
}

std::vector<SlotOptimizer::Field> AdamW::Fields(size_t i) const {
  const AdamWState& s = states_[i];
  return {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}, {"step", at::Tensor(), s.step}};
}

void AdamW::SetCounter(size_t i, absl::string_view field, int64_t value) {
  if (field == "step") states_[i].step = value;
}

}  // namespace orthoshard::optimizers
