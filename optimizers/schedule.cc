#include "optimizers/schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace orthoshard::optimizers {

absl::Status ValidateSchedule(const ScheduleConfig& config) {
  if (config.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: warmup_steps must be >= 0, got ", config.warmup_steps));
  }
  if (!(config.min_lr_ratio >= 0.0 && config.min_lr_ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: min_lr_ratio must be in [0, 1], got ", config.min_lr_ratio));
  }
  if (config.kind == ScheduleKind::kConstant) return absl::OkStatus();
  if (config.total_steps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: total_steps must be > 0, got ", config.total_steps));
  }
  if (config.warmup_steps > config.total_steps) {
    return absl::InvalidArgumentError(absl::StrCat("schedule: warmup_steps ", config.warmup_steps,
                                                   " exceeds total_steps ", config.total_steps));
  }
  if (config.kind == ScheduleKind::kWsd) {
    if (config.decay_steps <= 0 ||
        config.decay_steps > config.total_steps - config.warmup_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule: WSD decay_steps must be in [1, total_steps - warmup_steps = ",
          config.total_steps - config.warmup_steps, "], got ", config.decay_steps));
    }
  }
  return absl::OkStatus();
}

double LrMultiplier(const ScheduleConfig& config, int64_t step) {
  if (step < config.warmup_steps) {
    return static_cast<double>(step + 1) / static_cast<double>(config.warmup_steps);
  }
  const double floor = config.min_lr_ratio;
  switch (config.kind) {
    case ScheduleKind::kConstant:
      return 1.0;
    case ScheduleKind::kWarmupCosine:
    case ScheduleKind::kWarmupLinear: {
      const int64_t span = config.total_steps - config.warmup_steps;
      const double progress =
          span == 0 ? 1.0
                    : std::min(1.0, static_cast<double>(step - config.warmup_steps) / span);
      if (config.kind == ScheduleKind::kWarmupLinear) return 1.0 - (1.0 - floor) * progress;
      // Cosine annealing (Loshchilov & Hutter, SGDR): floor + (1 - floor) * (1 + cos(pi * t)) / 2.
      return floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
    }
    case ScheduleKind::kWsd: {
      const int64_t decay_start = config.total_steps - config.decay_steps;
      if (step < decay_start) return 1.0;
      const double progress =
          std::min(1.0, static_cast<double>(step - decay_start) / config.decay_steps);
      return 1.0 - (1.0 - floor) * progress;
    }
  }
  return 1.0;
}

}  // namespace orthoshard::optimizers
