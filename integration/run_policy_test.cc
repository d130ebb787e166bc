// RunPolicy (run_policy.h): the trainer's rules for eval, checks, saves and stops, without ranks.
#include "integration/run_policy.h"

#include <csignal>
#include <vector>

#include "gtest/gtest.h"
#include "integration/config/trainer_config.h"

namespace orthoshard::integration {
namespace {

TrainerConfig Config() {
  TrainerConfig c;
  c.steps = 10;
  c.eval_every = 4;
  c.check_every = 3;
  c.save_every = 5;
  c.save_dir = "/ckpt";
  c.max_consecutive_skips = 2;
  return c;
}

TEST(RunPolicy, EvalCheckAndSaveEveryNAndAtTheEnd) {
  const TrainerConfig c = Config();
  RunPolicy policy(c, 1);
  EXPECT_EQ(policy.last_step(), 10);
  std::vector<int64_t> evals, checks, saves;
  for (int64_t step = 1; step <= 10; ++step) {
    const StepPlan plan = policy.After(step, false, 0);
    EXPECT_EQ(plan.last, step == 10) << step;
    EXPECT_FALSE(plan.stop_early || plan.give_up) << step;
    if (plan.eval) evals.push_back(step);
    if (plan.check) checks.push_back(step);
    if (plan.save) saves.push_back(step);
  }
  EXPECT_EQ(evals, (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(checks, (std::vector<int64_t>{3, 6, 9, 10}));
  EXPECT_EQ(saves, (std::vector<int64_t>{5, 10}));
}

TEST(RunPolicy, NothingPeriodicWhenTheIntervalsAreZeroAndNoSaveWithoutADir) {
  TrainerConfig c = Config();
  c.eval_every = c.check_every = c.save_every = 0;
  c.save_dir.clear();
  RunPolicy policy(c, 1);
  for (int64_t step = 1; step < 10; ++step) {
    const StepPlan plan = policy.After(step, false, 0);
    EXPECT_FALSE(plan.eval || plan.check || plan.save) << step;
  }
  const StepPlan end = policy.After(10, false, 0);
  EXPECT_TRUE(end.last && end.eval && end.check);
  EXPECT_FALSE(end.save);
}

// stop_after ends the run early (a later --resume continues) with the final eval and save; a
// resumed run starts after the saved step.
TEST(RunPolicy, StopAfterAndResume) {
  TrainerConfig c = Config();
  c.stop_after = 7;
  RunPolicy policy(c, 4);
  EXPECT_EQ(policy.first_step(), 4);
  EXPECT_EQ(policy.last_step(), 7);
  const StepPlan plan = policy.After(7, false, 0);
  EXPECT_TRUE(plan.last && plan.eval && plan.save);
  EXPECT_FALSE(plan.stop_early);
}

// A signal ends the run after the step in flight: saved, checked, not evaluated (a preempted job
// has seconds); at the last step it changes nothing.
TEST(RunPolicy, AStopRequestSavesWithoutEvaluating) {
  const TrainerConfig c = Config();
  RunPolicy policy(c, 1);
  const StepPlan plan = policy.After(2, false, SIGTERM);
  EXPECT_TRUE(plan.last && plan.stop_early && plan.save && plan.check);
  EXPECT_FALSE(plan.eval || plan.give_up);
  RunPolicy at_end(c, 10);
  const StepPlan end = at_end.After(10, false, SIGTERM);
  EXPECT_TRUE(end.last && end.eval && end.save);
  EXPECT_FALSE(end.stop_early);
}

// max_consecutive_skips non-finite steps in a row give up (saved, not evaluated); a good step in
// between resets the count.
TEST(RunPolicy, ConsecutiveSkipsGiveUp) {
  const TrainerConfig c = Config();
  RunPolicy policy(c, 1);
  EXPECT_FALSE(policy.After(1, true, 0).give_up);
  EXPECT_FALSE(policy.After(2, false, 0).give_up);
  EXPECT_EQ(policy.consecutive_skips(), 0);
  EXPECT_FALSE(policy.After(3, true, 0).give_up);
  const StepPlan plan = policy.After(4, true, 0);
  EXPECT_TRUE(plan.give_up && plan.last && plan.save);
  EXPECT_FALSE(plan.eval);
  EXPECT_EQ(policy.consecutive_skips(), 2);
  TrainerConfig never = Config();
  never.max_consecutive_skips = 0;
  RunPolicy patient(never, 1);
  for (int64_t step = 1; step < 10; ++step) EXPECT_FALSE(patient.After(step, true, 0).give_up);
}

}  // namespace
}  // namespace orthoshard::integration
