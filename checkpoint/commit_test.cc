#include "checkpoint/commit.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard.h"
#include "checkpoint/testing/test_checkpoint.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::checkpoint::testing::ScratchDir;
using ::orthoshard::checkpoint::testing::SmallModel;
using ::orthoshard::checkpoint::testing::TestCheckpointOptions;
using ::orthoshard::checkpoint::testing::WriteTestCheckpoint;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::_;

// Loads the checkpoint `latest` points at and checks every tensor; returns its step.
int64_t LoadLatestAndVerify(const std::string& root) {
  absl::StatusOr<std::string> dir = ResolveLatest(root);
  EXPECT_OK(dir);
  if (!dir.ok()) return -1;
  absl::StatusOr<Manifest> manifest = ReadManifest(*dir);
  EXPECT_OK(manifest);
  if (!manifest.ok()) return -1;
  EXPECT_THAT(VerifyCheckpoint(*dir, *manifest), IsEmpty());
  return manifest->step();
}

TEST(CommitTest, StepDirNames) {
  EXPECT_EQ(StepDirName(123), "step_000123");
  EXPECT_EQ(StepDirName(1234567), "step_1234567");
  EXPECT_EQ(ParseStepDirName("step_000123"), 123);
  EXPECT_EQ(ParseStepDirName("step_1234567"), 1234567);
  EXPECT_EQ(ParseStepDirName("step_000123.tmp"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("step_123"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("step_0001234"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("latest"), std::nullopt);
}

TEST(CommitTest, CommitRenamesAndPointsLatest) {
  const std::string root = JoinPath(ScratchDir(), "ckpt");  // created by BeginCheckpoint
  ASSERT_OK_AND_ASSIGN(std::string tmp, BeginCheckpoint(root, 7));
  EXPECT_EQ(tmp, JoinPath(root, "step_000007.tmp"));
  ASSERT_OK(testing::WriteTestCheckpointFiles(tmp, 7, SmallModel()).status());
  EXPECT_THAT(ResolveLatest(root), StatusIs(absl::StatusCode::kNotFound,
                                            HasSubstr("pointer file " + root + "/latest is "
                                                      "missing (no committed checkpoint)")));
  ASSERT_OK(CommitCheckpoint(root, 7));
  ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(JoinPath(root, "latest")));
  EXPECT_EQ(contents, "step_000007\n");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDir(root));
  EXPECT_THAT(names, ElementsAre("latest", "step_000007"));
  EXPECT_EQ(LoadLatestAndVerify(root), 7);
  ASSERT_OK_AND_ASSIGN(std::string resolved, ResolveCheckpointDir(root));
  EXPECT_EQ(resolved, JoinPath(root, "step_000007"));
  ASSERT_OK_AND_ASSIGN(resolved, ResolveCheckpointDir(JoinPath(root, "step_000007")));
  EXPECT_EQ(resolved, JoinPath(root, "step_000007"));

  EXPECT_THAT(BeginCheckpoint(root, 7),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already committed")));
  EXPECT_THAT(CommitCheckpoint(root, 7),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already committed")));
  EXPECT_THAT(CommitCheckpoint(root, 8),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("step_000008.tmp")));
  EXPECT_THAT(BeginCheckpoint(root, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step is -1")));
}

TEST(CommitTest, KeepsTheLastK) {
  const std::string root = ScratchDir();
  TestCheckpointOptions options;
  options.commit.keep_last = 2;
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_OK(WriteTestCheckpoint(root, step, SmallModel(), options));
  }
  EXPECT_THAT(*ListCheckpoints(root), ElementsAre(4, 5));
  EXPECT_EQ(LoadLatestAndVerify(root), 5);
  options.commit.keep_last = 0;  // keep all
  ASSERT_OK(WriteTestCheckpoint(root, 6, SmallModel(), options));
  EXPECT_THAT(*ListCheckpoints(root), ElementsAre(4, 5, 6));
}

TEST(CommitTest, NeverDeletesTheCheckpointLatestPointsAtNorNewerOnes) {
  const std::string root = ScratchDir();
  TestCheckpointOptions options;
  options.commit.keep_last = 0;
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_OK(WriteTestCheckpoint(root, step, SmallModel(), options));
  }
  // An operator rolled `latest` back to step 2: 3 and 4 are an abandoned timeline, 1 is older.
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "latest"), "step_000002\n"));
  EXPECT_THAT(*CheckpointsNewerThanLatest(root), ElementsAre(3, 4));
  ASSERT_OK(GarbageCollect(root, 1));
  EXPECT_THAT(*ListCheckpoints(root), ElementsAre(2, 3, 4));
  EXPECT_EQ(LoadLatestAndVerify(root), 2);
}

// A crash between the rename of step_000004.tmp and the update of `latest` leaves step_000004/
// complete but unnamed (made here by hand: the same files on disk). A resumed run follows `latest`
// (step 3), trains to step 4 again and saves it: the save replaces the abandoned step_000004/
// instead of failing every time with "already committed" (a crash loop), and keep_last counts
// only the timeline up to `latest`.
TEST(CommitTest, ASaveReplacesAnAbandonedCheckpointOfTheSameStep) {
  const std::string root = ScratchDir();
  TestCheckpointOptions options;
  options.commit.keep_last = 2;
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_OK(WriteTestCheckpoint(root, step, SmallModel(), options));
  }
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "latest"), "step_000003\n"));
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "step_000004/marker"), "the abandoned one"));
  EXPECT_THAT(*CheckpointsNewerThanLatest(root), ElementsAre(4));
  ASSERT_OK_AND_ASSIGN(std::string tmp, BeginCheckpoint(root, 4));
  ASSERT_OK(testing::WriteTestCheckpointFiles(tmp, 4, SmallModel()).status());
  ASSERT_OK(CommitCheckpoint(root, 4, options.commit));
  EXPECT_EQ(LoadLatestAndVerify(root), 4);
  ASSERT_OK_AND_ASSIGN(bool marker, PathExists(JoinPath(root, "step_000004/marker")));
  EXPECT_FALSE(marker);  // the new checkpoint, not the abandoned one
  EXPECT_THAT(*CheckpointsNewerThanLatest(root), IsEmpty());
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDir(root));
  EXPECT_THAT(names, ElementsAre("latest", "step_000003", "step_000004"));

  // A crash between moving the abandoned one aside and removing it leaves step_N.replaced: the
  // next commit's garbage collection removes it.
  ASSERT_OK(MakeDir(JoinPath(root, "step_000004.replaced")));
  ASSERT_OK(WriteTestCheckpoint(root, 5, SmallModel(), options));
  ASSERT_OK_AND_ASSIGN(names, ListDir(root));
  EXPECT_THAT(names, ElementsAre("latest", "step_000004", "step_000005"));
}

// `latest` as a directory is a corrupt root (exit 2 at the CLI), not an I/O error.
TEST(CommitTest, LatestThatIsADirectoryIsDataLoss) {
  const std::string root = ScratchDir();
  ASSERT_OK(MakeDir(JoinPath(root, "latest")));
  EXPECT_THAT(ResolveLatest(root),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(root + "/latest is a directory, expected a file")));
}

TEST(CommitTest, CleansStaleTmpDirectories) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 1, SmallModel()));
  // Leftovers of crashed saves: one of a later step, one of the step about to be saved.
  ASSERT_OK(MakeDir(JoinPath(root, "step_000009.tmp")));
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "step_000009.tmp/rank0.safetensors"), "partial"));
  ASSERT_OK(MakeDir(JoinPath(root, "step_000002.tmp")));
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "step_000002.tmp/stale"), "old"));
  ASSERT_OK_AND_ASSIGN(std::string tmp, BeginCheckpoint(root, 2));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> in_tmp, ListDir(tmp));
  EXPECT_THAT(in_tmp, IsEmpty());  // the same step's leftover was removed by Begin
  ASSERT_OK(testing::WriteTestCheckpointFiles(tmp, 2, SmallModel()).status());
  ASSERT_OK(CommitCheckpoint(root, 2));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDir(root));
  EXPECT_THAT(names, ElementsAre("latest", "step_000001", "step_000002"));
}

TEST(CommitTest, ErrorsNameThePointerFile) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 3, SmallModel()));
  ASSERT_OK(RemoveRecursively(JoinPath(root, "step_000003")));
  EXPECT_THAT(ResolveLatest(root),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(root + "/latest points at 'step_000003' but " + root +
                                 "/step_000003 does not exist")));
  EXPECT_THAT(ResolveCheckpointDir(root),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("does not exist"), HasSubstr("holds no manifest.binpb"))));
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "latest"), "../etc\n"));
  EXPECT_THAT(ResolveLatest(root),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(root + "/latest holds \"../etc\", not a step directory name")));
}

// States a crash can leave between the protocol's steps, built directly: whatever the state,
// `latest` names a complete checkpoint.
TEST(CommitTest, CrashBetweenRenameAndPointerUpdateKeepsThePreviousCheckpoint) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 1, SmallModel()));
  ASSERT_OK_AND_ASSIGN(std::string tmp, BeginCheckpoint(root, 2));
  ASSERT_OK(testing::WriteTestCheckpointFiles(tmp, 2, SmallModel()).status());
  ASSERT_OK(Rename(tmp, JoinPath(root, "step_000002")));            // renamed, then crash
  ASSERT_OK(WriteFileAtomically(JoinPath(root, "latest.tmp"), "step_0"));  // torn pointer temp
  EXPECT_EQ(LoadLatestAndVerify(root), 1);
}

// A forked child saving step 2 is killed with SIGKILL in the middle of writing a shard.
TEST(CommitTest, SigkillDuringSaveLeavesThePreviousCheckpointLoadable) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 1, SmallModel()));
  int ready[2];
  int never[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(never), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    close(never[1]);
    absl::StatusOr<std::string> tmp = BeginCheckpoint(root, 2);
    if (!tmp.ok()) _exit(3);
    std::vector<uint8_t> chunk(1 << 20, 0x5A);
    absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(
        JoinPath(*tmp, "rank0.safetensors"), {{"big", "U8", {64 << 20}}});
    if (!writer.ok() || !writer->Append(chunk).ok()) _exit(4);
    char byte = 'r';
    if (write(ready[1], &byte, 1) != 1) _exit(5);
    read(never[0], &byte, 1);  // blocks: the parent kills us mid-write
    _exit(6);
  }
  close(ready[1]);
  close(never[0]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  close(ready[0]);
  close(never[1]);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;

  ASSERT_OK_AND_ASSIGN(bool tmp_left, PathExists(JoinPath(root, "step_000002.tmp")));
  EXPECT_TRUE(tmp_left);
  ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(JoinPath(root, "latest")));
  EXPECT_EQ(contents, "step_000001\n");
  EXPECT_EQ(LoadLatestAndVerify(root), 1);
  // The half-written shard is unreadable as a checkpoint file, and it is never what `latest` names.
  EXPECT_THAT(SafetensorsReader::Open(JoinPath(root, "step_000002.tmp/rank0.safetensors")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));

  // The next save of a later step commits and removes the stale `.tmp`.
  ASSERT_OK(WriteTestCheckpoint(root, 3, SmallModel()));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDir(root));
  EXPECT_THAT(names, ElementsAre("latest", "step_000001", "step_000003"));
  EXPECT_EQ(LoadLatestAndVerify(root), 3);
}

// One writer per root: a second lock fails naming the holder; the lock goes with the object (and
// with the process: the kernel drops a dead process's flock).
TEST(CommitTest, OneWriterPerRoot) {
  const std::string root = JoinPath(ScratchDir(), "new_root");
  ASSERT_OK_AND_ASSIGN(RootLock first, LockRoot(root, "pretrain rank 0"));
  EXPECT_EQ(first.path(), JoinPath(root, ".lock"));
  EXPECT_THAT(LockRoot(root, "another run"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("checkpoint root " + root + " is in use by another run (pid " +
                                       std::to_string(getpid()) + " on host "),
                             HasSubstr(": pretrain rank 0); wait for it to end"))));
  RootLock moved = std::move(first);
  EXPECT_THAT(LockRoot(root, "another run"), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  { RootLock gone = std::move(moved); }
  ASSERT_OK_AND_ASSIGN(RootLock second, LockRoot(root, "the next run"));
  // The lock file is not a checkpoint: the root still holds none.
  EXPECT_THAT(*ListCheckpoints(root), IsEmpty());
}

}  // namespace
}  // namespace orthoshard::checkpoint
