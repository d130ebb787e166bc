// ChainedOptimizer: routes every param to Muon or AdamW (see routing.h), and owns what spans both:
// the lr schedule, global gradient-norm clipping, the non-finite step skip and the step counters.
//
// Clipping and Muon. Newton–Schulz normalises its input, so scaling a Muon gradient by a clip factor
// only changes its weight against the momentum history, and scaling after the momentum update would
// do nothing at all; meanwhile Muon's gradients, counted in one global norm, set the clip factor of
// AdamW's params too ("global-norm clipping silently stalling Muon" is a reported pitfall of
// distributed Muon). Two documented modes:
//   kAllBeforeMomentum: the norm covers every gradient; all of them, Muon's included, are scaled
//                       before they enter the moments / momentum buffer (Megatron's behaviour).
//   kExcludeMuon:       the norm covers AdamW's gradients only and only they are scaled; Muon's
//                       gradients are used as they are.
// Either way every gradient is checked for inf/NaN: a step with a non-finite gradient changes no
// param, moment, momentum buffer, step count or schedule position, and is counted in skipped_steps().
//
// Distributed use: LocalGradStats() returns partial sums of squares; a caller that owns only some
// params all-reduces them (sum) across ranks and passes the result to StepWithStats(), so every rank
// takes the same clip and skip decision.
#ifndef ORTHOSHARD_OPTIMIZERS_CHAINED_H_
#define ORTHOSHARD_OPTIMIZERS_CHAINED_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optimizers/adamw.h"
#include "optimizers/muon.h"
#include "optimizers/optimizer.h"
#include "optimizers/routing.h"
#include "optimizers/schedule.h"

namespace orthoshard::optimizers {

enum class ClipMode { kAllBeforeMomentum, kExcludeMuon };

struct ChainedConfig {
  RoutingConfig routing;
  AdamWHyper adamw;         // hyperparameters of the AdamW group of 2-D params (embeddings, head)
  // Weight decay of the second AdamW group: params that are not 2-D (norms, biases), which are
  // usually not decayed (Megatron's default no_weight_decay_cond). Its other hyperparameters are
  // `adamw`'s.
  double adamw_non_matrix_weight_decay = 0.0;
  MuonHyper muon;           // hyperparameters of the Muon group
  ScheduleConfig schedule;  // multiplies both groups' lr
  double max_grad_norm = 1.0;  // global-norm clip threshold; <= 0 disables clipping
  ClipMode clip_mode = ClipMode::kAllBeforeMomentum;
};

// Partial sums of ||g||^2, per optimizer; add them across ranks to get the global values.
struct GradStats {
  double adamw_sum_squares = 0.0;
  double muon_sum_squares = 0.0;
};

struct StepResult {
  bool skipped = false;        // a gradient was not finite; nothing changed
  double grad_norm = 0.0;      // the norm clipping looked at (see ClipMode)
  double clip_scale = 1.0;     // factor applied to the clipped gradients (1 = not clipped)
  double lr_multiplier = 1.0;  // schedule factor used (0 when skipped)
  GradStats stats;             // the global sums of squares the decision was made from
};

// The clip-and-skip decision of one chained step (local or distributed) from the global sums of
// squared gradients; `any_nonfinite`: some rank saw a value that is not finite. grad_norm covers
// Muon's params only under ClipMode::kAllBeforeMomentum. Skipped (lr_multiplier 0) when anything is
// not finite; else clip_scale = max_grad_norm / (grad_norm + 1e-6) when that is below 1 (Megatron's
// clip_grad_by_total_norm_fp32) and lr_multiplier is the schedule's after `steps_taken` steps.
StepResult DecideStep(const ChainedConfig& config, const GradStats& global, bool any_nonfinite,
                      int64_t steps_taken);

// The clip scale Muon's params get: result.clip_scale under kAllBeforeMomentum, else 1.
double MuonClipScale(const ChainedConfig& config, const StepResult& result);

class ChainedOptimizer {
 public:
  // Routes `params` and builds the two optimizers (either may be empty). Errors: kInvalidArgument
  // from routing, the schedule, hyperparameters or the params themselves.
  static absl::StatusOr<std::unique_ptr<ChainedOptimizer>> Create(std::vector<Param> params,
                                                                  ChainedConfig config);

  // What went where; log routing_report().ToString() at start-up.
  const RoutingReport& routing_report() const { return report_; }

  absl::StatusOr<GradStats> LocalGradStats() const;

  // One step from (globally reduced) stats: skip if not finite, else clip, schedule, update both.
  // Errors: as Optimizer::Step (then, if the AdamW half had already stepped, state is partially
  // updated; a caller treats this as fatal).
  absl::StatusOr<StepResult> StepWithStats(const GradStats& stats);

  // LocalGradStats() then StepWithStats() (single process).
  absl::StatusOr<StepResult> Step();

  // Names: "adamw/<param>/<field>", "muon/<param>/<field>", "chained/step",
  // "chained/skipped_steps" (int64 scalars). Import errors as Optimizer::ImportState.
  std::vector<NamedTensor> ExportState() const;
  absl::Status ImportState(absl::Span<const NamedTensor> state);

  // Errors: kNotFound "no param named 'x'"; kInvalidArgument as CheckGrad.
  absl::Status SetGrad(const std::string& name, const at::Tensor& grad);

  int64_t steps_taken() const { return steps_; }
  int64_t skipped_steps() const { return skipped_; }
  Optimizer& adamw() { return *adamw_; }
  Optimizer& muon() { return *muon_; }

 private:
  ChainedOptimizer(ChainedConfig config, RoutingReport report, std::unique_ptr<AdamW> adamw,
                   std::unique_ptr<Muon> muon)
      : config_(std::move(config)),
        report_(std::move(report)),
        adamw_(std::move(adamw)),
        muon_(std::move(muon)) {}

  ChainedConfig config_;
  RoutingReport report_;
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<Muon> muon_;
  int64_t steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_CHAINED_H_
