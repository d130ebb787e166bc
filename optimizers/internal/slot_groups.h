// The per-group loops AdamW and Muon share. Both hold `std::vector<Group>` with
// `Group{Hyper hp; std::vector<Slot> slots;}` and `Slot{MainParam p; ...per-param state...}`; these
// templates are everything about such groups that does not depend on the update rule.
#ifndef ORTHOSHARD_OPTIMIZERS_INTERNAL_SLOT_GROUPS_H_
#define ORTHOSHARD_OPTIMIZERS_INTERNAL_SLOT_GROUPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "optimizers/optimizer.h"

namespace orthoshard::optimizers::internal {

// Optimizer::Step's skeleton: checks every gradient first (nothing is updated when one no longer
// matches), then calls update(slot, hp, lr, fp32 grad) for every slot with a gradient and syncs its
// model param. `kind` prefixes a LibTorch error ("AdamW step: ...").
template <typename Group, typename Update>
absl::Status StepGroups(std::vector<Group>& groups, const StepContext& context, const char* kind,
                        Update update) {
  for (const Group& g : groups) {
    for (const auto& s : g.slots) RETURN_IF_ERROR(CheckGrad(s.p.param));
  }
  try {
    for (Group& g : groups) {
      const double lr = g.hp.lr * context.lr_multiplier;
      for (auto& s : g.slots) {
        if (!s.p.param.grad.defined()) continue;
        update(s, g.hp, lr, GradAsFloat(s.p.param.grad, context.grad_scale));
        SyncModelParam(s.p);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(kind, " step: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// Optimizer::GradSumSquares over every slot.
template <typename Group>
absl::StatusOr<double> GroupsGradSumSquares(const std::vector<Group>& groups) {
  std::vector<MainParam> params;
  for (const Group& g : groups) {
    for (const auto& s : g.slots) params.push_back(s.p);
  }
  return LocalGradSumSquares(params);
}

// Optimizer::SetGrad: checks `grad` against the named param before replacing its gradient.
template <typename Group>
absl::Status SetGroupsGrad(std::vector<Group>& groups, const std::string& name,
                           const at::Tensor& grad) {
  for (Group& g : groups) {
    for (auto& s : g.slots) {
      if (s.p.param.name != name) continue;
      Param candidate = s.p.param;
      candidate.grad = grad;
      RETURN_IF_ERROR(CheckGrad(candidate));
      s.p.param.grad = grad;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("no param named '", name, "'"));
}

// Optimizer::num_params and numel.
template <typename Group>
int64_t GroupsNumParams(const std::vector<Group>& groups) {
  int64_t n = 0;
  for (const Group& g : groups) n += static_cast<int64_t>(g.slots.size());
  return n;
}
template <typename Group>
int64_t GroupsNumel(const std::vector<Group>& groups) {
  int64_t n = 0;
  for (const Group& g : groups) {
    for (const auto& s : g.slots) n += s.p.main.numel();
  }
  return n;
}

}  // namespace orthoshard::optimizers::internal

#endif  // ORTHOSHARD_OPTIMIZERS_INTERNAL_SLOT_GROUPS_H_
