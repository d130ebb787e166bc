// Runs the Communicator conformance suite on the Gloo backend with 2, 3 and 4 real processes (the
// multi-rank harness, testing/multi_rank.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/testing/conformance.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using testing::MultiRankOptions;
using testing::RunConformanceCase;

MultiRankOptions WithTimeout(absl::Duration timeout) {
  return testing::WithTimeouts(timeout, absl::Seconds(60));
}

class GlooConformanceTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooConformanceTest, Arithmetic) {
  testing::RunOnRanks(
      GetParam(), [](Communicator& comm) { ASSERT_OK(RunConformanceCase("arithmetic", comm)); },
      WithTimeout(absl::Seconds(20)));
}

TEST_P(GlooConformanceTest, RankSleepsPastTimeout) {
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) { ASSERT_OK(RunConformanceCase("sleep_past_timeout", comm)); },
      WithTimeout(absl::Seconds(2)));
}

TEST_P(GlooConformanceTest, RankKilled) {
  const int world = GetParam();
  const testing::MultiRankOutcome outcome = testing::LaunchOnRanks(
      world, [](Communicator& comm) { ASSERT_OK(RunConformanceCase("killed_rank", comm)); },
      WithTimeout(absl::Seconds(2)));
  if (testing::InRankProcess()) return;
  // The last rank SIGKILLs itself; every other rank must see the contract's errors and pass.
  EXPECT_EQ(outcome.launch.exit_code, 128 + 9) << outcome.Transcript();
  EXPECT_EQ(outcome.launch.first_failed_rank, world - 1);
  for (int r = 0; r + 1 < world; ++r) {
    EXPECT_TRUE(outcome.passed[r]) << "rank " << r << ":\n" << outcome.Transcript();
  }
}

TEST_P(GlooConformanceTest, AllToAll) {
  testing::RunOnRanks(
      GetParam(), [](Communicator& comm) { ASSERT_OK(RunConformanceCase("all_to_all", comm)); },
      WithTimeout(absl::Seconds(20)));
}

TEST_P(GlooConformanceTest, AllToAllNotLaunchedByAPeer) {
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) { ASSERT_OK(RunConformanceCase("all_to_all_not_launched", comm)); },
      WithTimeout(absl::Seconds(2)));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooConformanceTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::collectives
