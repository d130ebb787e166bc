// DistributedDataParallel with real Gloo ranks: 1, 2, 3 and 4 processes of ddp_test_worker, each
// checking grad sync and grad accumulation over micro-batches against mean gradients recomputed
// locally as the ranks compute them (bitwise at 1 and 2 ranks, within the bound of another
// cross-rank summation order at 3 and 4), overlap on vs off (bitwise), the all-reduce grad sync of
// replicated optimizers (the whole mean on every rank, no param sync), param sync with and without overlap (and the order of the
// pre-forward hook's waits and launches), dp larger than the number of params, and the timeout
// error. See ddp/testing/ddp_test_worker.cc for the phases.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/launcher.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::ddp {
namespace {

using ::testing::Contains;

class DdpMultiRankTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpMultiRankTest, AllPhasesPassOnEveryRank) {
  const int world = GetParam();
  std::vector<std::string> lines;
  collectives::LaunchOptions options;
  options.binary = "ddp/testing/ddp_test_worker";
  options.nprocs = world;
  options.grace_period = absl::Seconds(20);
  options.timeout = absl::Seconds(120);
  options.forward_signals = false;
  options.output = [&lines](absl::string_view line, bool) { lines.emplace_back(line); };
  ASSERT_OK_AND_ASSIGN(collectives::LaunchResult result, collectives::LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 0) << absl::StrJoin(lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(lines, Contains(absl::StrCat("[rank ", r, "] ddp worker passed on rank ", r)))
        << absl::StrJoin(lines, "\n");
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpMultiRankTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::ddp
