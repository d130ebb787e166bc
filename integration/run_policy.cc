#include "integration/run_policy.h"

namespace orthoshard::integration {

int64_t LastStep(const TrainerConfig& config) {
  return config.stop_after > 0 ? config.stop_after : config.steps;
}

RunPolicy::RunPolicy(const TrainerConfig& config, int64_t first_step)
    : config_(config), first_step_(first_step), last_step_(LastStep(config)) {}

StepPlan RunPolicy::After(int64_t step, bool skipped, int stop_signal) {
  const TrainerConfig& c = config_;
  auto every = [step](int64_t n) { return n > 0 && step % n == 0; };
  consecutive_skips_ = skipped ? consecutive_skips_ + 1 : 0;
  StepPlan plan;
  plan.stop_early = stop_signal != 0 && step < last_step_;
  plan.give_up = c.max_consecutive_skips > 0 && consecutive_skips_ >= c.max_consecutive_skips;
  plan.last = step == last_step_ || plan.give_up || plan.stop_early;
  plan.eval = !plan.give_up && !plan.stop_early && (plan.last || every(c.eval_every));
  plan.check = plan.last || every(c.check_every);
  plan.save = !c.save_dir.empty() && (plan.last || every(c.save_every));
  return plan;
}

}  // namespace orthoshard::integration
