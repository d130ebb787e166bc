// Distributed save/load in real multi-process Gloo jobs (testing/ckpt_worker.cc). What each test
// proves (the worker compares with optimizers/distributed's single-process reference, whose
// trajectory the sharded optimizer matches bitwise, see distributed_optimizer_test):
//   ResumeAtSameDp          3 steps, save, load, 3 more at dp 2 == 6 straight steps, bitwise
//   ResumeAtDp2To3 / 3To1   saved at dp 2 (3), loaded at dp 3 (1): params after load bitwise equal
//                           to the saved ones, the next 3 steps bitwise equal to the reference
//                           continued at the new dp; shared state (step, opaque data position,
//                           seed, configs) round-trips
//   AsyncSave               snapshot + background write while the next step runs: the committed
//                           step-3 checkpoint resumes bitwise (the snapshot is isolated from the
//                           step that ran during the write), step 4 is `latest`
//   FailedAsyncSave         a write failure injected on rank 1: the next Start returns it on every
//                           rank, starts nothing, and `latest` stays at the previous step
//   KilledRankMidSave       rank 1 SIGKILLed after writing its shard of step 4: `latest` still
//                           names step 3, which loads and resumes bitwise
//   CorruptedShard          one flipped byte in rank1.safetensors: load fails on every rank naming
//                           the file, and nothing (params, optimizer state) changed
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "collectives/launcher.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr char kWorker[] = "checkpoint/testing/ckpt_worker";

struct Job {
  int exit_code = 0;
  std::vector<std::string> lines;
};

Job Launch(const std::string& scenario, const std::string& root, int world,
           std::vector<std::string> extra = {}) {
  Job job;
  collectives::LaunchOptions options;
  options.binary = kWorker;
  options.args = {scenario, root, "3"};
  for (std::string& a : extra) options.args.push_back(std::move(a));
  options.nprocs = world;
  options.grace_period = absl::Seconds(2);
  options.timeout = absl::Seconds(120);
  options.forward_signals = false;
  options.output = [&job](absl::string_view line, bool) { job.lines.emplace_back(line); };
  absl::StatusOr<collectives::LaunchResult> result = collectives::LaunchLocal(options);
  EXPECT_OK(result.status());
  job.exit_code = result.ok() ? result->exit_code : -1;
  return job;
}

void ExpectPass(const std::string& scenario, const std::string& root, int world,
                std::vector<std::string> extra = {}) {
  Job job = Launch(scenario, root, world, std::move(extra));
  EXPECT_EQ(job.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(job.lines, Contains(absl::StrCat("[rank ", r, "] PASS ", scenario, " rank ", r)))
        << absl::StrJoin(job.lines, "\n");
  }
}

std::string FreshRoot(const std::string& name) {
  const std::string root = JoinPath(::testing::TempDir(), name);
  EXPECT_OK(RemoveRecursively(root));
  return root;
}

TEST(DistributedCheckpointTest, ResumeAtSameDpMatchesStraightRunBitwise) {
  const std::string root = FreshRoot("same_dp");
  ExpectPass("save", root, 2);
  ExpectPass("resume", root, 2, {"2"});
}

TEST(DistributedCheckpointTest, ResumeAtDp2To3) {
  const std::string root = FreshRoot("dp2to3");
  ExpectPass("save", root, 2);
  ExpectPass("resume", root, 3, {"2"});
}

TEST(DistributedCheckpointTest, ResumeAtDp3To1) {
  const std::string root = FreshRoot("dp3to1");
  ExpectPass("save", root, 3);
  ExpectPass("resume", root, 1, {"3"});
}

TEST(DistributedCheckpointTest, AsyncSaveSnapshotsWhileTrainingContinues) {
  const std::string root = FreshRoot("async");
  ExpectPass("async_save", root, 2);
  ASSERT_OK_AND_ASSIGN(std::string latest, ResolveLatest(root));
  EXPECT_EQ(latest, JoinPath(root, "step_000004"));
  // The step-3 checkpoint holds the values before the step that ran during its write.
  ExpectPass("resume", JoinPath(root, "step_000003"), 2, {"2"});
}

TEST(DistributedCheckpointTest, FailedAsyncSaveIsReportedAtTheNextCallAndNeverCommitted) {
  const std::string root = FreshRoot("async_fail");
  ExpectPass("async_fail", root, 2);
  ASSERT_OK_AND_ASSIGN(std::string latest, ResolveLatest(root));
  EXPECT_EQ(latest, JoinPath(root, "step_000003"));
  ASSERT_OK_AND_ASSIGN(bool step4, PathExists(JoinPath(root, "step_000004")));
  EXPECT_FALSE(step4);
}

TEST(DistributedCheckpointTest, KilledRankMidSaveLeavesLatestAtThePreviousCheckpoint) {
  const std::string root = FreshRoot("crash");
  Job job = Launch("crash", root, 2);
  EXPECT_NE(job.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  ASSERT_OK_AND_ASSIGN(std::string latest, ResolveLatest(root));
  EXPECT_EQ(latest, JoinPath(root, "step_000003"));
  ASSERT_OK_AND_ASSIGN(bool step4, PathExists(JoinPath(root, "step_000004")));
  EXPECT_FALSE(step4);
  ExpectPass("resume", root, 2, {"2"});
}

TEST(DistributedCheckpointTest, CorruptedShardFailsNamingItAndChangesNothing) {
  const std::string root = FreshRoot("corrupt");
  ExpectPass("save", root, 2);
  const std::string shard = JoinPath(root, "step_000003/rank1.safetensors");
  {
    std::FILE* f = std::fopen(shard.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, -3, SEEK_END), 0);
    const int c = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, -3, SEEK_END), 0);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
  }
  Job job = Launch("corrupt", root, 2);
  EXPECT_EQ(job.exit_code, 0) << absl::StrJoin(job.lines, "\n");
  int errors = 0;
  for (const std::string& line : job.lines) {
    if (!absl::StrContains(line, "LOADERR")) continue;
    ++errors;
    EXPECT_THAT(line, HasSubstr("rank1.safetensors"));
    EXPECT_THAT(line, HasSubstr("crc32c"));
  }
  EXPECT_EQ(errors, 2) << absl::StrJoin(job.lines, "\n");
}

}  // namespace
}  // namespace orthoshard::checkpoint
