// Learning-rate schedules: a multiplier of each param group's base lr as a function of the number of
// optimizer steps taken. Pure functions, no tensors; the ChainedOptimizer evaluates them once per
// successful step (skipped steps do not advance the schedule, as in Megatron's OptimizerParamScheduler).
#ifndef ORTHOSHARD_OPTIMIZERS_SCHEDULE_H_
#define ORTHOSHARD_OPTIMIZERS_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace orthoshard::optimizers {

enum class ScheduleKind {
  kConstant,      // 1 after warmup, forever
  kWarmupCosine,  // linear warmup, then cosine decay to min_lr_ratio at total_steps
  kWarmupLinear,  // linear warmup, then linear decay to min_lr_ratio at total_steps
  kWsd,           // warmup-stable-decay: warmup, 1 until total_steps - decay_steps, then linear decay
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kConstant;
  // Steps of linear warmup: step s (0-based) of the warmup uses (s + 1) / warmup_steps.
  int64_t warmup_steps = 0;
  // Step at which the decay reaches min_lr_ratio (cosine, linear, WSD); the multiplier stays there after.
  int64_t total_steps = 0;
  // WSD only: length of the final decay phase, ending at total_steps.
  int64_t decay_steps = 0;
  // Floor of the decay as a fraction of the base lr, in [0, 1].
  double min_lr_ratio = 0.0;
};

// Checks the config. Errors: kInvalidArgument naming the field and its bound, e.g.
// "schedule: warmup_steps 10 exceeds total_steps 5".
absl::Status ValidateSchedule(const ScheduleConfig& config);

// The lr multiplier for the step with 0-based index `step` (the number of successful steps taken
// before it). Precondition: ValidateSchedule(config) is OK and step >= 0.
double LrMultiplier(const ScheduleConfig& config, int64_t step);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_SCHEDULE_H_
