// Runs the Communicator conformance suite on the NCCL backend on CUDA tensors, one process per
// GPU: 1 rank always; 2, 3 and 4 ranks when the machine has that many GPUs (skipped otherwise).
// Tagged manual and requires-gpu: see testing/nccl_conformance_worker.cc for how to run it.
#include <string>

#ifdef ORTHOSHARD_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

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

constexpr char kWorker[] = "collectives/testing/nccl_conformance_worker";

int GpuCount() {
#ifdef ORTHOSHARD_CUDA
  return c10::cuda::device_count();
#else
  return 0;
#endif
}

class NcclConformanceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
#ifndef ORTHOSHARD_CUDA
    GTEST_SKIP() << "built without --config=cuda";
#endif
    if (GpuCount() < GetParam()) {
      GTEST_SKIP() << GetParam() << " ranks need " << GetParam() << " GPUs, found " << GpuCount();
    }
  }
};

TEST_P(NcclConformanceTest, Arithmetic) {
  const int world = GetParam();
  ASSERT_OK_AND_ASSIGN(testing::ConformanceJob job,
                       testing::RunConformanceJob(kWorker, "arithmetic", world, absl::Seconds(20)));
  EXPECT_EQ(job.launch.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(job.lines,
                Contains(absl::StrCat("[rank ", r, "] ", testing::PassLine("arithmetic", r))));
  }
}

TEST_P(NcclConformanceTest, RankSleepsPastTimeout) {
  const int world = GetParam();
  if (world < 2) GTEST_SKIP() << "needs a surviving rank";
  ASSERT_OK_AND_ASSIGN(
      testing::ConformanceJob job,
      testing::RunConformanceJob(kWorker, "sleep_past_timeout", world, absl::Seconds(2)));
  EXPECT_EQ(job.launch.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(job.lines, Contains(absl::StrCat("[rank ", r, "] ",
                                                 testing::PassLine("sleep_past_timeout", r))));
  }
}

TEST_P(NcclConformanceTest, RankKilled) {
  const int world = GetParam();
  if (world < 2) GTEST_SKIP() << "needs a surviving rank";
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

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclConformanceTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::collectives
