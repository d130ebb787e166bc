// `pretrain --dist=fsdp` (ZeRO-3: each rank keeps only its shard of params, grads and optimizer
// state) end to end, against `--dist=layerwise` (whole params and grads on every rank), which it
// must equal bitwise: the same values are computed in the same order (the same layouts, the same
// gathers and reduce-scatters on the same buckets, the same optimizer on the same shards), so the
// initial, final and eval losses and the exact param checksum are the same digits.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/testing/pretrain_runner.h"

namespace orthoshard::integration {
namespace {

using testing::JsonField;
using testing::JsonNumber;
using testing::LastLine;
using testing::RunPretrain;
using testing::RunResult;
using testing::TempDir;
using testing::ExpectRefusedBeforeLaunch;
using testing::With;

// Every field that fsdp and layerwise runs of the same steps must agree on, as printed (17 digits
// for the checksum).
const std::vector<std::string> kSameRun = {
    "steps",     "initial_loss",   "final_loss",   "initial_eval_loss",
    "eval_loss", "param_checksum", "skipped_steps"};
// A resumed run reports its own first step and evaluates this rank count's eval slices: what must
// agree with a straight run is where training ends.
const std::vector<std::string> kSameEnd = {"steps", "final_loss", "param_checksum"};

void ExpectSameTraining(const std::string& a, const std::string& b, const std::string& what,
                        const std::vector<std::string>& fields = kSameRun) {
  for (const std::string& field : fields) {
    EXPECT_EQ(JsonField(a, field), JsonField(b, field)) << what << ": " << field;
  }
  EXPECT_FALSE(JsonField(a, "param_checksum").empty()) << a;
}

// The bytes of the "memory" entry of `rank`: {"rank":R,"params_bytes":...}.
int64_t RankBytes(const std::string& json, int rank, const std::string& field) {
  const std::string entry = absl::StrCat("{\"rank\":", rank, ",");
  const size_t at = json.find(entry);
  EXPECT_NE(at, std::string::npos) << json;
  if (at == std::string::npos) return -1;
  return static_cast<int64_t>(JsonNumber(json.substr(at), field));
}

struct Config {
  int ranks;
  const char* optimizer;
  int micro_batches;
  // --target_buckets=0: buckets of --bucket_elems alone, below the largest AdamW matrices (tiny's
  // fc1 [384, 64], qkv [192, 64], fc2 [64, 192]), which then get a bucket each in every mode.
  bool large_params_alone = false;
};

class FsdpMatchesLayerwise : public ::testing::TestWithParam<Config> {};

// 1, 2, 3 and 4 ranks; Muon (whole matrices on their owners, clipping on) and AdamW, with and
// without micro-batches; at 3 ranks also with AdamW matrices of at least the bucket size, each in a
// bucket of its own (every mode lays out the same buckets: with that only under fsdp, its
// reduce-scatters would sum 3 ranks' terms in other orders than layerwise's, and the checksums
// differ); an eval every 2 steps (forward passes without backward gather and release too).
// Memory: a fsdp rank keeps 1/N of what a layerwise rank keeps of params and grads (the ranks'
// shards add up to the whole buffers exactly) and the same optimizer state, and nothing full-size
// between steps beyond its transient peak.
TEST_P(FsdpMatchesLayerwise, BitwiseWithAShardOfTheMemory) {
  const Config c = GetParam();
  std::vector<std::string> runs;
  for (const char* dist : {"--dist=layerwise", "--dist=fsdp"}) {
    RunResult run = RunPretrain(
        {"--steps=4", "--eval_every=2", "--eval_batches=1", "--check_every=0", "--global_batch=24",
         "--warmup_steps=1", absl::StrCat("--nproc_per_node=", c.ranks),
         absl::StrCat("--optimizer=", c.optimizer),
         absl::StrCat("--micro_batches=", c.micro_batches), "--bucket_elems=8192",
         c.large_params_alone ? "--target_buckets=0" : "--target_buckets=4", dist});
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    runs.push_back(LastLine(run.out));
  }
  const std::string& layerwise = runs[0];
  const std::string& fsdp = runs[1];
  EXPECT_EQ(JsonField(fsdp, "dist"), "fsdp");
  EXPECT_EQ(JsonField(fsdp, "world_size"), absl::StrCat(c.ranks));
  ExpectSameTraining(layerwise, fsdp, absl::StrCat(c.ranks, " ranks ", c.optimizer));
  int64_t params = 0, grads = 0;
  for (int r = 0; r < c.ranks; ++r) {
    params += RankBytes(fsdp, r, "params_bytes");
    grads += RankBytes(fsdp, r, "grads_bytes");
    EXPECT_EQ(RankBytes(fsdp, r, "optimizer_state_bytes"),
              RankBytes(layerwise, r, "optimizer_state_bytes"));
    EXPECT_EQ(RankBytes(layerwise, r, "peak_transient_bytes"), 0);
    const int64_t peak = RankBytes(fsdp, r, "peak_transient_bytes");
    EXPECT_GT(peak, 0);
    // At most the whole buffers, params and grads; with one micro-batch (or sharded grad
    // accumulation) within DDP's stated bound, which the summary reports per rank.
    EXPECT_LE(peak,
              RankBytes(layerwise, r, "params_bytes") + RankBytes(layerwise, r, "grads_bytes"));
    if (c.micro_batches == 1) EXPECT_LE(peak, RankBytes(fsdp, r, "transient_bound_bytes"));
  }
  EXPECT_EQ(params, RankBytes(layerwise, 0, "params_bytes"));
  EXPECT_EQ(grads, RankBytes(layerwise, 0, "grads_bytes"));
}

INSTANTIATE_TEST_SUITE_P(RanksOptimizers, FsdpMatchesLayerwise,
                         ::testing::Values(Config{1, "muon", 1}, Config{2, "muon", 1},
                                           Config{2, "adamw", 2}, Config{3, "muon", 2},
                                           Config{3, "adamw", 1}, Config{4, "muon", 1},
                                           Config{4, "adamw", 2}, Config{3, "adamw", 1, true}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return absl::StrCat(info.param.ranks, "Ranks_", info.param.optimizer,
                                               "_micro", info.param.micro_batches,
                                               info.param.large_params_alone ? "_LargeAlone" : "");
                         });

// --fsdp_grad_accum=sharded: at one micro-batch the same ops as full accumulation (bitwise
// layerwise's training); at two, each micro-batch's reduce-scatter is added into the grad shards,
// so the peak stays within the stated bound and below full accumulation's, which holds every full
// grad from the first micro-batch (its numerics against full accumulation: ddp's
// sharded_memory_test). Refused outside fsdp.
TEST(Fsdp, ShardedGradAccumulation) {
  const std::vector<std::string> common = {
      "--steps=2",        "--eval_every=0",   "--check_every=0",    "--global_batch=16",
      "--warmup_steps=1", "--nproc_per_node=2", "--bucket_elems=8192"};
  auto run = [&](std::vector<std::string> extra) {
    RunResult result = RunPretrain(With(common, extra));
    EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
    return LastLine(result.out);
  };
  ExpectSameTraining(run({"--dist=layerwise"}),
                     run({"--dist=fsdp", "--fsdp_grad_accum=sharded"}), "one micro-batch");
  const std::string full = run({"--dist=fsdp", "--micro_batches=2"});
  const std::string sharded =
      run({"--dist=fsdp", "--micro_batches=2", "--fsdp_grad_accum=sharded"});
  for (int r = 0; r < 2; ++r) {
    const int64_t peak = RankBytes(sharded, r, "peak_transient_bytes");
    EXPECT_LE(peak, RankBytes(sharded, r, "transient_bound_bytes"));
    EXPECT_LT(peak, RankBytes(full, r, "peak_transient_bytes"));
  }
  ExpectRefusedBeforeLaunch(
      {{"--dist=layerwise --fsdp_grad_accum=sharded",
        "--fsdp_grad_accum=sharded adds each micro-batch's reduce-scatter into this rank's grad "
        "shards: it needs --dist=fsdp, got --dist=layerwise"}});
}

// A checkpoint is the same per-parameter records whatever the mode: one saved by a 2-rank fsdp run
// resumes with layerwise on 1 rank (2 micro-batches: the same mean gradient bits as 2 ranks), and
// one saved by that 1-rank layerwise run resumes fsdp on 2 ranks; both end bitwise where a
// straight 2-rank layerwise run does. Clipping is off: at another dp the global norm is summed
// over other slices (see pretrain_test's dp 2 -> 1 resume). The fsdp run's eval and its save both
// gather straddling buckets mid-run (save_every).
TEST(Fsdp, CheckpointsResumeAcrossModesAndRankCounts) {
  const std::vector<std::string> common = {
      "--steps=6",        "--eval_every=0",    "--check_every=0",    "--global_batch=16",
      "--warmup_steps=1", "--max_grad_norm=0", "--bucket_elems=8192"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return RunPretrain(args);
  };
  RunResult straight = with({"--dist=layerwise"});
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;

  const std::string from_fsdp = TempDir() + "/from_fsdp";
  RunResult saved =
      with({"--dist=fsdp", "--stop_after=3", "--save_every=2", "--save_dir=" + from_fsdp});
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  RunResult resumed = with({"--dist=layerwise", "--nproc_per_node=1", "--micro_batches=2",
                            "--resume", "--save_dir=" + from_fsdp});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  ExpectSameTraining(LastLine(straight.out), LastLine(resumed.out), "fsdp x2 -> layerwise x1",
                     kSameEnd);

  const std::string from_layerwise = TempDir() + "/from_layerwise";
  saved = with({"--dist=layerwise", "--nproc_per_node=1", "--micro_batches=2", "--stop_after=3",
                "--save_dir=" + from_layerwise});
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  resumed = with({"--dist=fsdp", "--resume", "--save_dir=" + from_layerwise});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  ExpectSameTraining(LastLine(straight.out), LastLine(resumed.out), "layerwise x1 -> fsdp x2",
                     kSameEnd);
}

}  // namespace
}  // namespace orthoshard::integration
