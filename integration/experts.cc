// ExpertStep (experts.h).
#include "integration/experts.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "common/status_macros.h"

namespace orthoshard::integration {

double MoeAuxLossCoeff(const TrainerConfig& c) {
  return c.moe_aux_loss_coeff < 0 ? 0.01 : c.moe_aux_loss_coeff;
}

double MoeZLossCoeff(const TrainerConfig& c) {
  return c.moe_z_loss_coeff < 0 ? 0.001 : c.moe_z_loss_coeff;
}

ExpertStep::ExpertStep(const TrainerConfig& c, const model::Gpt& model)
    : model_(model), active_(model.config().is_moe()) {
  alpha_ = MoeAuxLossCoeff(c);
  beta_ = MoeZLossCoeff(c);
}

at::Tensor ExpertStep::AddAuxLosses(const at::Tensor& objective, double scale) {
  if (!active_) return objective;
  const std::vector<model::MoeAux>& layers = model_.moe_aux();
  std::vector<at::Tensor> balance, z, counts;
  for (const model::MoeAux& a : layers) {
    balance.push_back(a.load_balance);
    z.push_back(a.z_loss);
    counts.push_back(a.tokens_per_expert);
  }
  const at::Tensor balance_sum = at::stack(balance).sum();
  const at::Tensor z_sum = at::stack(z).sum();
  // Kept where they were computed (no device sync per micro-batch): [aux, z, counts of [L, E]].
  const at::Tensor sums = at::stack({balance_sum.detach(), z_sum.detach()}).to(at::kDouble);
  const at::Tensor step_counts = at::stack(counts).to(at::kDouble);
  totals_ = totals_.defined() ? totals_ + sums : sums;
  counts_ = counts_.defined() ? counts_ + step_counts : step_counts;
  return objective + (balance_sum * alpha_ + z_sum * beta_).mul(scale).to(objective.scalar_type());
}

absl::StatusOr<ExpertStats> ExpertStep::Finish(collectives::Communicator& world,
                                               int micro_batches) {
  if (!active_) return ExpertStats{};
  at::Tensor all = at::cat({totals_, counts_.reshape({-1})}).to(world.device());
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, world.AllReduce(all));
  RETURN_IF_ERROR(work->Wait(world.timeout()));
  all = all.cpu();
  ExpertStats stats;
  stats.moe = true;
  // Per layer: 1 is a perfectly balanced router (f_e = P_e = 1 / E).
  const double per = static_cast<double>(world.size()) * std::max(1, micro_batches) *
                     static_cast<double>(std::max<int64_t>(1, counts_.size(0)));
  stats.aux_loss = all[0].item<double>() / per;
  stats.z_loss = all[1].item<double>() / per;
  const at::Tensor loads = all.narrow(0, 2, counts_.numel()).view(counts_.sizes());
  for (int64_t l = 0; l < loads.size(0); ++l) {
    const double mean = loads[l].mean().item<double>();
    stats.load_max.push_back(mean > 0 ? loads[l].max().item<double>() / mean : 0);
    stats.load_min.push_back(mean > 0 ? loads[l].min().item<double>() / mean : 0);
  }
  totals_ = at::Tensor();
  counts_ = at::Tensor();
  return stats;
}

}  // namespace orthoshard::integration
