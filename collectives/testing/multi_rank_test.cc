// The multi-rank harness against itself: every rank runs the body with a real communicator; a
// failure on one rank is that rank's, with its output; several launches in one test run in order
// and share the test's temporary directory.
#include <fstream>
#include <string>

#include <ATen/ops/full.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

TEST(MultiRankTest, EveryRankRunsTheBodyWithItsCommunicator) {
  RunOnRanks(3, [](Communicator& comm) {
    EXPECT_EQ(comm.size(), 3);
    at::Tensor t = at::full({4}, static_cast<float>(comm.rank() + 1));
    ASSERT_OK_AND_ASSIGN(auto work, comm.AllReduce(t));
    ASSERT_OK(work->Wait(comm.timeout()));
    EXPECT_EQ(t[0].item<float>(), 6.0f);  // 1 + 2 + 3
  });
}

TEST(MultiRankTest, AFailureIsReportedForItsRankWithItsOutput) {
  const MultiRankOutcome outcome = LaunchOnRanks(3, [](Communicator& comm) {
    std::printf("hello from rank %d\n", comm.rank());
    EXPECT_NE(comm.rank(), 1) << "rank 1 disagrees";
  });
  if (InRankProcess()) return;
  EXPECT_TRUE(outcome.passed[0]) << outcome.Transcript();
  EXPECT_FALSE(outcome.passed[1]) << outcome.Transcript();
  EXPECT_TRUE(outcome.passed[2]) << outcome.Transcript();
  EXPECT_EQ(outcome.launch.rank_exit_codes[1], 1);
  EXPECT_THAT(outcome.lines[1], Contains("hello from rank 1"));
  EXPECT_THAT(absl::StrJoin(outcome.lines[1], "\n"), HasSubstr("rank 1 disagrees"));
  EXPECT_THAT(absl::StrJoin(outcome.lines[0], "\n"), ::testing::Not(HasSubstr("disagrees")));
}

TEST(MultiRankTest, LaunchesOfOneTestRunInOrderAndShareTheTempDir) {
  const std::string path = ::testing::TempDir() + "/multi_rank_test_handoff";
  RunOnRanks(2, [&path](Communicator& comm) {
    if (comm.rank() == 0) std::ofstream(path) << "written at 2 ranks";
  });
  RunOnRanks(3, [&path](Communicator& comm) {
    std::ifstream in(path);
    std::string text;
    std::getline(in, text);
    EXPECT_EQ(text, "written at 2 ranks") << "rank " << comm.rank();
    EXPECT_EQ(comm.size(), 3);
  });
}

}  // namespace
}  // namespace orthoshard::collectives::testing
