// Runs the Communicator conformance suite on the Gloo backend with 2, 3 and 4 real processes.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "collectives/testing/conformance.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using ::testing::Contains;

constexpr char kWorker[] = "collectives/testing/gloo_conformance_worker";

class GlooConformanceTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooConformanceTest, Arithmetic) {
  const int world = GetParam();
  ASSERT_OK_AND_ASSIGN(testing::ConformanceJob job,
                       testing::RunConformanceJob(kWorker, "arithmetic", world, absl::Seconds(20)));
  EXPECT_EQ(job.launch.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(job.lines,
                Contains(absl::StrCat("[rank ", r, "] ", testing::PassLine("arithmetic", r))));
  }
}

TEST_P(GlooConformanceTest, RankSleepsPastTimeout) {
  const int world = GetParam();
  ASSERT_OK_AND_ASSIGN(
      testing::ConformanceJob job,
      testing::RunConformanceJob(kWorker, "sleep_past_timeout", world, absl::Seconds(2)));
  EXPECT_EQ(job.launch.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(job.lines, Contains(absl::StrCat("[rank ", r, "] ",
                                                 testing::PassLine("sleep_past_timeout", r))));
  }
}

TEST_P(GlooConformanceTest, RankKilled) {
  const int world = GetParam();
  ASSERT_OK_AND_ASSIGN(testing::ConformanceJob job,
                       testing::RunConformanceJob(kWorker, "killed_rank", world, absl::Seconds(2)));
  EXPECT_EQ(job.launch.exit_code, 128 + 9) << absl::StrJoin(job.lines, "\n");
  EXPECT_EQ(job.launch.first_failed_rank, world - 1);
  for (int r = 0; r + 1 < world; ++r) {
    EXPECT_EQ(job.launch.rank_exit_codes[r], 0) << absl::StrJoin(job.lines, "\n");
    EXPECT_THAT(job.lines,
                Contains(absl::StrCat("[rank ", r, "] ", testing::PassLine("killed_rank", r))));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooConformanceTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::collectives
