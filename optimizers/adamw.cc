#include "optimizers/adamw.h"

#include <cmath>
#include <unordered_set>
#include <utility>

#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "optimizers/internal/fused_elementwise.h"
#include "optimizers/internal/slot_groups.h"

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

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(std::vector<AdamWGroup> groups) {
  std::vector<Group> out;
  std::unordered_set<std::string> names;
  for (AdamWGroup& g : groups) {
    RETURN_IF_ERROR(ValidateAdamWHyper(g.hp));
    Group group{g.hp, {}};
    for (Param& p : g.params) {
      if (!names.insert(p.name).second) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate param name '", p.name, "'"));
      }
      ASSIGN_OR_RETURN(MainParam mp, MakeMainParam(std::move(p)));
      AdamWState state = MakeAdamWState(mp.main);
      group.slots.push_back(Slot{std::move(mp), std::move(state)});
    }
    out.push_back(std::move(group));
  }
  return std::unique_ptr<AdamW>(new AdamW(std::move(out)));
}

absl::Status AdamW::Step(const StepContext& context) {
  return internal::StepGroups(
      groups_, context, "AdamW",
      [](Slot& s, const AdamWHyper& hp, double lr, const at::Tensor& grad) {
        AdamWUpdate(s.p.main, grad, s.state, hp, lr);
      });
}

absl::StatusOr<double> AdamW::GradSumSquares() const {
  return internal::GroupsGradSumSquares(groups_);
}

std::vector<NamedTensor> AdamW::ExportState() const {
  std::vector<NamedTensor> out;
  for (const Group& g : groups_) {
    for (const Slot& s : g.slots) {
      const std::string& n = s.p.param.name;
      out.push_back({n + "/exp_avg", s.state.exp_avg.clone()});
      out.push_back({n + "/exp_avg_sq", s.state.exp_avg_sq.clone()});
      out.push_back({n + "/step", at::full({}, s.state.step, at::kLong)});
      if (s.p.owns_main()) out.push_back({n + "/main_param", s.p.main.clone()});
    }
  }
  return out;
}

absl::Status AdamW::ImportState(absl::Span<const NamedTensor> state) {
  std::vector<std::string> expected;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // destination, source
  std::vector<std::pair<Slot*, int64_t>> steps;
  const at::Tensor step_like = at::empty({}, at::kLong);
  for (Group& g : groups_) {
    for (Slot& s : g.slots) {
      const std::string& n = s.p.param.name;
      ASSIGN_OR_RETURN(at::Tensor m, FindState(state, n + "/exp_avg", s.state.exp_avg));
      ASSIGN_OR_RETURN(at::Tensor v, FindState(state, n + "/exp_avg_sq", s.state.exp_avg_sq));
      ASSIGN_OR_RETURN(at::Tensor step, FindState(state, n + "/step", step_like));
      copies.push_back({s.state.exp_avg, m});
      copies.push_back({s.state.exp_avg_sq, v});
      steps.push_back({&s, step.item<int64_t>()});
      expected.insert(expected.end(), {n + "/exp_avg", n + "/exp_avg_sq", n + "/step"});
      if (s.p.owns_main()) {
        ASSIGN_OR_RETURN(at::Tensor main, FindState(state, n + "/main_param", s.p.main));
        copies.push_back({s.p.main, main});
        expected.push_back(n + "/main_param");
      }
    }
  }
  RETURN_IF_ERROR(CheckNoUnexpectedState(state, expected));
  for (auto& [dst, src] : copies) dst.copy_(src);
  for (auto& [slot, step] : steps) {
    slot->state.step = step;
    SyncModelParam(slot->p);
  }
  return absl::OkStatus();
}

int64_t AdamW::num_params() const { return internal::GroupsNumParams(groups_); }

int64_t AdamW::numel() const { return internal::GroupsNumel(groups_); }

absl::Status AdamW::SetGrad(const std::string& name, const at::Tensor& grad) {
  return internal::SetGroupsGrad(groups_, name, grad);
}

}  // namespace orthoshard::optimizers
