// The mixture-of-experts part of a training step: the auxiliary losses added to what backward runs
// on, and the expert loads and auxiliary losses of the step over every rank (for the log line,
// TensorBoard and the summary). Inactive, and free, for a dense model.
#ifndef ORTHOSHARD_INTEGRATION_EXPERTS_H_
#define ORTHOSHARD_INTEGRATION_EXPERTS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "integration/config/trainer_config.h"
#include "integration/metrics/run_metrics.h"
#include "model/model.h"

namespace orthoshard::integration {

// --moe_aux_loss_coeff and --moe_z_loss_coeff with their defaults (-1) resolved: 0.01 (Switch
// Transformer's alpha) and 0.001 (ST-MoE's z-loss weight).
double MoeAuxLossCoeff(const TrainerConfig& config);
double MoeZLossCoeff(const TrainerConfig& config);

class ExpertStep {
 public:
  ExpertStep(const TrainerConfig& config, const model::Gpt& model);

  bool active() const { return active_; }

  // After a micro-batch's forward: `objective` (the loss as backward will run it) plus, weighted by
  // `scale` (1 / micro-batches), alpha x the layers' load-balancing losses and beta x their
  // z-losses from model.moe_aux(); their values and token counts are kept for Finish. Inactive:
  // `objective` itself.
  at::Tensor AddAuxLosses(const at::Tensor& objective, double scale);

  // The step's ExpertStats over every rank of `world` (one SUM all-reduce; every rank calls it
  // once per step, after the micro-batches), and a reset for the next step. Inactive: {} without
  // a collective. Errors: the all-reduce's.
  absl::StatusOr<ExpertStats> Finish(collectives::Communicator& world, int micro_batches);

 private:
  const model::Gpt& model_;
  bool active_ = false;
  double alpha_ = 0, beta_ = 0;
  // This step's sums on this rank, on the model's device: [load balance, z-loss] (unweighted, over
  // layers and micro-batches) in fp64, and the token copies per expert, [L, E] fp64.
  at::Tensor totals_, counts_;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_EXPERTS_H_
