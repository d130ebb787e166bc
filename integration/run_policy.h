// When a training run evaluates, checks its ranks agree, saves and stops: a pure function of the
// config and what the ranks agreed after each step, so the rules are tested without ranks
// (run_policy_test) and the trainer's loop only carries them out.
#ifndef ORTHOSHARD_INTEGRATION_RUN_POLICY_H_
#define ORTHOSHARD_INTEGRATION_RUN_POLICY_H_

#include <cstdint>

#include "integration/config/trainer_config.h"

namespace orthoshard::integration {

// The last step a run trains: config.stop_after when set, else config.steps.
int64_t LastStep(const TrainerConfig& config);

// What to do after one step (every rank computes the same, from agreed inputs).
struct StepPlan {
  bool last = false;        // no step follows: the run ends after this plan
  bool stop_early = false;  // a stop was requested (a signal) before the last step
  bool give_up = false;     // max_consecutive_skips non-finite steps in a row: fail the run
  bool eval = false;        // evaluate (never when stopping early or giving up: seconds matter)
  bool check = false;       // compare the ranks' param checksums
  bool save = false;        // checkpoint this step (the final save when `last`)
};

class RunPolicy {
 public:
  // Steps first_step .. last_step, last_step being stop_after when set, else steps.
  RunPolicy(const TrainerConfig& config, int64_t first_step);

  int64_t first_step() const { return first_step_; }
  int64_t last_step() const { return last_step_; }
  int64_t consecutive_skips() const { return consecutive_skips_; }

  // The plan after step `step`, whose update was `skipped` (non-finite gradients), with
  // `stop_signal` (0: none) requested on some rank. Call once per step, in order.
  StepPlan After(int64_t step, bool skipped, int stop_signal);

 private:
  const TrainerConfig& config_;
  int64_t first_step_;
  int64_t last_step_;
  int64_t consecutive_skips_ = 0;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_RUN_POLICY_H_
