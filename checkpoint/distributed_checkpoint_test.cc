// Distributed save/load in real multi-process Gloo jobs (the multi-rank harness). Each job trains
// optimizers/distributed's test model on deterministic per-rank gradients and compares with the
// single-process reference trajectory, which the distributed optimizer matches bitwise in either
// mode (see distributed_optimizer_test). What each test proves:
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
//   ManifestFlips           a flipped bit in every byte of the manifest is refused by the load
//                           that --resume runs (kDataLoss naming manifest.binpb); nothing changed
//   Fsdp*                   a run with sharded residency (ZeRO-3: each rank keeps only its shards,
//                           the snapshot gathers buckets whose params straddle shards) saved at dp
//                           2 resumes bitwise with full residency at dp 3, a full one saved at dp 3
//                           resumes sharded at dp 2, and an async save of a sharded run resumes
//   Replicated*             a replicated run (every rank steps everything, saves its share) saved
//                           at dp 2 resumes bitwise sharded at dp 3, and a sharded one replicated
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ops/equal.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "buffers/bucket_sync.h"
#include "checkpoint/commit.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/file_util.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::checkpoint {
namespace {

using collectives::Communicator;
using collectives::testing::RunOnRanks;
using optimizers::distributed::testing::Check;
using optimizers::distributed::testing::CompareParamsBitwise;

namespace od = optimizers::distributed;
namespace odt = optimizers::distributed::testing;

constexpr int kBucketSize = 300;

struct Options {
  std::string scenario;
  std::string root;
  int steps = 0;
  int old_dp = 0;
  bool replicated = false;  // the run's mode: replicated, else sharded
  bool shard_params = false;  // sharded residency (ZeRO-3)
};

// One training step as DDP and the trainer run it: grad sync, step, param sync.
absl::Status TrainStep(collectives::Communicator& comm, const std::vector<layout::ParamSpec>& specs,
                       odt::DistributedModel& model, optimizers::ChainedOptimizer& opt, int step,
                       bool replicated) {
  odt::FillRankGrads(specs, model, comm.rank(), step);
  ASSIGN_OR_RETURN(auto works, buffers::LaunchGradSync(
                                   comm, model.buffers,
                                   replicated ? buffers::GradSync::kAllReduce
                                              : buffers::GradSync::kReduceScatter,
                                   collectives::ReduceOp::kAvg));
  RETURN_IF_ERROR(buffers::WaitAll(works, comm.timeout()));
  odt::ReleaseFullGrads(model);
  RETURN_IF_ERROR(opt.Step().status());
  ASSIGN_OR_RETURN(works, buffers::LaunchParamSync(comm, model.buffers));
  return buffers::WaitAll(works, comm.timeout());
}

SharedState Shared(int64_t step) {
  SharedState s;
  s.step = step;
  s.data_position = std::string("pos\0\xff", 5) + std::to_string(step);
  s.rng_seed = 1234 + step;
  s.model_config = "small_model(2)";
  s.optimizer_config = "test_config";
  return s;
}

absl::Status RunScenario(const Options& o, collectives::Communicator& comm) {
  const int dp = comm.size();
  const std::vector<layout::ParamSpec> specs = odt::SmallModel(2);
  const optimizers::ChainedConfig config = odt::TestConfig(0.0);
  ASSIGN_OR_RETURN(
      odt::DistributedModel model,
      odt::BuildDistributedModel(
          specs, dp, layout::Strategy::kLayerwise, kBucketSize,
          o.shard_params ? buffers::Residency::kSharded : buffers::Residency::kFull, comm.rank()));
  ASSIGN_OR_RETURN(auto opt, od::CreateDistributedOptimizer(
                                 model.buffers, &comm, config,
                                 o.replicated ? od::DistributedMode::kReplicated
                                              : od::DistributedMode::kSharded));
  ASSIGN_OR_RETURN(auto ref, odt::Reference::Create(specs, config));
  const std::string& s = o.scenario;

  if (s == "save" || s == "crash") {
    if (o.shard_params && dp > 1) {
      // The snapshot's gather path is exercised: some param straddles a shard boundary.
      bool straddler = false;
      for (const buffers::ParamAndGradBuffer* b : model.buffers) {
        for (const layout::ParamPlacement& p : b->layout().params) {
          straddler = straddler || b->layout().OwnerOf(p) < 0;
        }
      }
      RETURN_IF_ERROR(Check(straddler, "no param straddles a shard boundary"));
    }
    for (int step = 0; step < o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step, o.replicated));
    }
    RETURN_IF_ERROR(SaveDistributedCheckpoint(o.root, Shared(o.steps), model.buffers, *opt, comm));
    if (s == "crash") {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps, o.replicated));
      SaveOptions save;
      if (comm.rank() == 1) save.after_shard_written = [] {
          std::raise(SIGKILL);
          return absl::OkStatus();
        };
      RETURN_IF_ERROR(
          SaveDistributedCheckpoint(o.root, Shared(o.steps + 1), model.buffers, *opt, comm, save));
      return absl::InternalError("the save with a killed rank returned OK");
    }
    return absl::OkStatus();
  }
  if (s == "async_save") {
    // Save at STEPS asynchronously while the next step runs (it changes params and state after
    // the snapshot), then at STEPS + 1; the resume scenario then checks step STEPS + 1 is latest
    // and the step-STEPS directory holds the pre-step values (loaded by "resume_at").
    AsyncCheckpointSaver saver(&comm);
    for (int step = 0; step < o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step, o.replicated));
    }
    RETURN_IF_ERROR(Check(!saver.write_finished(), "write_finished before any Start"));
    RETURN_IF_ERROR(saver.Start(o.root, Shared(o.steps), model.buffers, *opt));
    RETURN_IF_ERROR(Check(saver.in_flight(), "no save in flight after Start"));
    RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps, o.replicated));
    RETURN_IF_ERROR(saver.Start(o.root, Shared(o.steps + 1), model.buffers, *opt));  // finalizes
    // write_finished() turns true once this rank's write ends, without blocking; Finalize resets
    // it.
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (!saver.write_finished() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    RETURN_IF_ERROR(Check(saver.write_finished(), "the write did not finish within 60 s"));
    RETURN_IF_ERROR(saver.Finalize());
    return Check(!saver.write_finished() && !saver.in_flight(), "still in flight after Finalize");
  }
  if (s == "async_fail") {
    // Step STEPS committed synchronously; the async save of STEPS + 1 fails on rank 1 (injected
    // after its write); the next Start reports it on every rank and commits nothing.
    for (int step = 0; step < o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step, o.replicated));
    }
    RETURN_IF_ERROR(SaveDistributedCheckpoint(o.root, Shared(o.steps), model.buffers, *opt, comm));
    RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps, o.replicated));
    AsyncCheckpointSaver saver(&comm);
    SaveOptions failing;
    if (comm.rank() == 1) {
      failing.after_shard_written = [] { return absl::UnavailableError("injected write failure"); };
    }
    RETURN_IF_ERROR(saver.Start(o.root, Shared(o.steps + 1), model.buffers, *opt, failing));
    RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps + 1, o.replicated));
    const absl::Status next = saver.Start(o.root, Shared(o.steps + 2), model.buffers, *opt);
    const absl::StatusCode want =
        comm.rank() == 1 ? absl::StatusCode::kUnavailable : absl::StatusCode::kAborted;
    RETURN_IF_ERROR(Check(next.code() == want, "next Start returned " + next.ToString()));
    RETURN_IF_ERROR(Check(!saver.in_flight(), "a save started after a failed one"));
    return saver.Finalize();
  }
  if (s == "corrupt") {
    ASSIGN_OR_RETURN(const std::vector<at::Tensor> before, odt::WholeParams(comm, model));
    absl::StatusOr<SharedState> loaded =
        LoadDistributedCheckpoint(o.root, model.buffers, *opt, comm);
    RETURN_IF_ERROR(Check(!loaded.ok(), "loading a corrupted checkpoint succeeded"));
    const std::string error = loaded.status().ToString();
    RETURN_IF_ERROR(Check(absl::StrContains(error, "rank1.safetensors") &&
                              absl::StrContains(error, "crc32c"),
                          "the load error does not name the corrupted shard: " + error));
    RETURN_IF_ERROR(Check(opt->steps_taken() == 0, "optimizer state changed by a failed load"));
    ASSIGN_OR_RETURN(const std::vector<at::Tensor> after, odt::WholeParams(comm, model));
    return CompareParamsBitwise(specs, after, before, "after a failed load");
  }
  if (s == "manifest_flips") {
    // One rank (a load at any dp reads the manifest alike): every byte of step 3's manifest with
    // one bit flipped (bit byte % 8: each bit position across the file; manifest_test flips all
    // 8 per byte through the same decoder, a load per flip costs ~1 ms more), each load refused
    // before anything is changed; then the good manifest loads.
    ASSIGN_OR_RETURN(const std::vector<at::Tensor> before, odt::WholeParams(comm, model));
    const std::string path = JoinPath(o.root, "step_000003/manifest.binpb");
    ASSIGN_OR_RETURN(const std::string good, ReadFileToString(path));
    for (size_t byte = 0; byte < good.size(); ++byte) {
      const size_t bit = byte * 8 + byte % 8;
      std::string bad = good;
      bad[byte] ^= static_cast<char>(1 << (byte % 8));
      RETURN_IF_ERROR(WriteFileAtomically(path, bad));
      const absl::StatusOr<SharedState> loaded =
          LoadDistributedCheckpoint(o.root, model.buffers, *opt, comm);
      RETURN_IF_ERROR(Check(loaded.status().code() == absl::StatusCode::kDataLoss &&
                                absl::StrContains(loaded.status().message(), "manifest.binpb"),
                            absl::StrCat("bit ", bit, " of ", good.size() * 8, ": the load gave ",
                                         loaded.status().ToString())));
    }
    RETURN_IF_ERROR(Check(opt->steps_taken() == 0, "optimizer state changed by a refused load"));
    ASSIGN_OR_RETURN(const std::vector<at::Tensor> after, odt::WholeParams(comm, model));
    RETURN_IF_ERROR(CompareParamsBitwise(specs, after, before, "after the refused loads"));
    RETURN_IF_ERROR(WriteFileAtomically(path, good));
    return LoadDistributedCheckpoint(o.root, model.buffers, *opt, comm).status();
  }
  if (s == "resume") {
    ASSIGN_OR_RETURN(SharedState got, LoadDistributedCheckpoint(o.root, model.buffers, *opt, comm));
    const SharedState want = Shared(o.steps);
    RETURN_IF_ERROR(Check(got.step == want.step && got.data_position == want.data_position &&
                              got.rng_seed == want.rng_seed &&
                              got.model_config == want.model_config &&
                              got.optimizer_config == want.optimizer_config,
                          "shared state differs"));
    RETURN_IF_ERROR(Check(opt->steps_taken() == o.steps, "optimizer step count not restored"));
    for (int step = 0; step < o.steps; ++step) RETURN_IF_ERROR(ref->Step(o.old_dp, step).status());
    ASSIGN_OR_RETURN(std::vector<at::Tensor> params, odt::WholeParams(comm, model));
    RETURN_IF_ERROR(CompareParamsBitwise(specs, params, ref->params(), "after load"));
    for (int step = o.steps; step < 2 * o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step, o.replicated));
      RETURN_IF_ERROR(ref->Step(dp, step).status());
      ASSIGN_OR_RETURN(params, odt::WholeParams(comm, model));
      RETURN_IF_ERROR(
          CompareParamsBitwise(specs, params, ref->params(), absl::StrCat("step ", step)));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown scenario " + s);
}

// Runs `scenario` on `world` ranks over `root`, 3 steps; `old_dp` is the dp it was saved at.
void RunJob(const std::string& scenario, const std::string& root, int world, int old_dp = 0,
            bool replicated = false, bool shard_params = false) {
  RunOnRanks(world, [&](Communicator& comm) {
    ASSERT_OK(RunScenario({scenario, root, 3, old_dp, replicated, shard_params}, comm));
  });
}

std::string FreshRoot(const std::string& name) {
  const std::string root = JoinPath(::testing::TempDir(), name);
  // Only the test process starts afresh: a rank process of a later launch must find the files.
  if (!collectives::testing::InRankProcess()) {
    EXPECT_OK(RemoveRecursively(root));
  }
  return root;
}

TEST(DistributedCheckpointTest, ResumeAtSameDpMatchesStraightRunBitwise) {
  const std::string root = FreshRoot("same_dp");
  RunJob("save", root, 2);
  RunJob("resume", root, 2, 2);
}

TEST(DistributedCheckpointTest, ResumeAtDp2To3) {
  const std::string root = FreshRoot("dp2to3");
  RunJob("save", root, 2);
  RunJob("resume", root, 3, 2);
}

TEST(DistributedCheckpointTest, ResumeAtDp3To1) {
  const std::string root = FreshRoot("dp3to1");
  RunJob("save", root, 3);
  RunJob("resume", root, 1, 3);
}

TEST(DistributedCheckpointTest, ReplicatedRunResumesShardedAtAnotherDp) {
  const std::string root = FreshRoot("replicated_to_sharded");
  RunJob("save", root, 2, 0, /*replicated=*/true);
  RunJob("resume", root, 3, 2);
}

TEST(DistributedCheckpointTest, ShardedRunResumesReplicated) {
  const std::string root = FreshRoot("sharded_to_replicated");
  RunJob("save", root, 3);
  RunJob("resume", root, 2, 3, /*replicated=*/true);
}

TEST(DistributedCheckpointTest, FsdpRunResumesWithFullResidencyAtAnotherDp) {
  const std::string root = FreshRoot("fsdp_to_full");
  RunJob("save", root, 2, 0, false, /*shard_params=*/true);
  RunJob("resume", root, 3, 2);
}

TEST(DistributedCheckpointTest, FullResidencyRunResumesFsdpAtAnotherDp) {
  const std::string root = FreshRoot("full_to_fsdp");
  RunJob("save", root, 3);
  RunJob("resume", root, 2, 3, false, /*shard_params=*/true);
}

TEST(DistributedCheckpointTest, FsdpAsyncSaveResumes) {
  const std::string root = FreshRoot("fsdp_async");
  RunJob("async_save", root, 2, 0, false, /*shard_params=*/true);
  RunJob("resume", JoinPath(root, "step_000003"), 2, 2, false, /*shard_params=*/true);
}

TEST(DistributedCheckpointTest, AsyncSaveSnapshotsWhileTrainingContinues) {
  const std::string root = FreshRoot("async");
  RunJob("async_save", root, 2);
  if (!collectives::testing::InRankProcess()) {
    ASSERT_OK_AND_ASSIGN(std::string latest, ResolveLatest(root));
    EXPECT_EQ(latest, JoinPath(root, "step_000004"));
  }
  // The step-3 checkpoint holds the values before the step that ran during its write.
  RunJob("resume", JoinPath(root, "step_000003"), 2, 2);
}

TEST(DistributedCheckpointTest, FailedAsyncSaveIsReportedAtTheNextCallAndNeverCommitted) {
  const std::string root = FreshRoot("async_fail");
  RunJob("async_fail", root, 2);
  if (collectives::testing::InRankProcess()) return;
  ASSERT_OK_AND_ASSIGN(std::string latest, ResolveLatest(root));
  EXPECT_EQ(latest, JoinPath(root, "step_000003"));
  ASSERT_OK_AND_ASSIGN(bool step4, PathExists(JoinPath(root, "step_000004")));
  EXPECT_FALSE(step4);
}

TEST(DistributedCheckpointTest, KilledRankMidSaveLeavesLatestAtThePreviousCheckpoint) {
  const std::string root = FreshRoot("crash");
  const collectives::testing::MultiRankOutcome crashed =
      collectives::testing::LaunchOnRanks(2, [&](Communicator& comm) {
        ASSERT_OK(RunScenario({"crash", root, 3, 0, false}, comm));
      });
  if (!collectives::testing::InRankProcess()) {
    EXPECT_EQ(crashed.launch.rank_exit_codes.at(1), 128 + SIGKILL) << crashed.Transcript();
    ASSERT_OK_AND_ASSIGN(std::string latest, ResolveLatest(root));
    EXPECT_EQ(latest, JoinPath(root, "step_000003"));
    ASSERT_OK_AND_ASSIGN(bool step4, PathExists(JoinPath(root, "step_000004")));
    EXPECT_FALSE(step4);
  }
  RunJob("resume", root, 2, 2);
}

TEST(DistributedCheckpointTest, CorruptedShardFailsNamingItAndChangesNothing) {
  const std::string root = FreshRoot("corrupt");
  RunJob("save", root, 2);
  if (!collectives::testing::InRankProcess()) {
    const std::string shard = JoinPath(root, "step_000003/rank1.safetensors");
    std::FILE* f = std::fopen(shard.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, -3, SEEK_END), 0);
    const int c = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, -3, SEEK_END), 0);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
  }
  RunJob("corrupt", root, 2);  // every rank: the load fails naming the shard, nothing changed
}

// The resume path refuses a flipped bit in every byte of a manifest, as `ckpt verify`
// (manifest_test's EveryBitFlipIsRefused: every bit) does; pretrain_reliability_test runs three
// of them through the binary.
TEST(DistributedCheckpointTest, ManifestFlipsAreRefusedByTheLoad) {
  const std::string root = FreshRoot("manifest_flips");
  RunJob("save", root, 2);
  RunJob("manifest_flips", root, 1);
}

}  // namespace
}  // namespace orthoshard::checkpoint
