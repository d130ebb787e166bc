// End-to-end equivalence of DDP + the distributed optimizers with real Gloo ranks: 1, 2, 3 and 4
// processes of e2e_worker (integration/e2e/e2e_worker.cc), each training a small transformer-like
// model for 4 steps on its slice of a 24-sample global batch, with real backward through DDP's
// gradient hooks and DDP's pre-forward hook in the model's forward, in every combination of
// sharded / replicated optimizer mode, overlap_grad_reduce on/off, overlap_param_gather on/off and
// 1 or 2 micro-batches, on a model with 4 Muon matrices and one with 2 (dp 3 and 4 exceed it).
// Each rank checks, against a single-process reference stepped alongside (see the worker's
// comment for the derivations), on any CPU: at every step the mean gradient bitwise equal to N
// simulated ranks' at N <= 2 and within 2 gamma(N - 1) sum_r |x_r| at N >= 3 (only the order of
// the cross-rank sum differs); the params after every step bitwise equal to the reference's given
// the same gradient and statistics (bf16 Newton-Schulz included); the global sum of squares within
// its summation bound; params bitwise equal across ranks; at 1 rank with 1 micro-batch bitwise
// equal to plain single-process training; the overlap paths really ran; each Muon matrix owned by
// one rank; every overlap variant bitwise equal to the no-overlap run of the same mode and micro
// count; some steps clipped.
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

namespace orthoshard::integration::e2e {
namespace {

using ::testing::Contains;

class DdpOptimizerEquivalenceTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpOptimizerEquivalenceTest, EveryRankMatchesSingleProcess) {
  const int world = GetParam();
  std::vector<std::string> lines;
  collectives::LaunchOptions options;
  options.binary = "integration/e2e/e2e_worker";
  options.nprocs = world;
  options.grace_period = absl::Seconds(20);
  options.timeout = absl::Seconds(240);
  options.forward_signals = false;
  options.output = [&lines](absl::string_view line, bool) { lines.emplace_back(line); };
  ASSERT_OK_AND_ASSIGN(collectives::LaunchResult result, collectives::LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 0) << absl::StrJoin(lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(lines, Contains(absl::StrCat("[rank ", r, "] e2e worker passed on rank ", r)))
        << absl::StrJoin(lines, "\n");
  }
  // 2 models x 2 modes x 4 overlap variants x 2 micro counts, each reported by every rank.
  int configs = 0;
  for (const std::string& line : lines) {
    if (line.find("e2e config ") != std::string::npos) ++configs;
  }
  EXPECT_EQ(configs, 32 * world) << absl::StrJoin(lines, "\n");
  ::testing::Test::RecordProperty("log", absl::StrJoin(lines, "\n"));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpOptimizerEquivalenceTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::integration::e2e
