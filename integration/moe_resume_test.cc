// Checkpoints of mixture-of-experts runs through the real `pretrain` binary (moe-tiny, 8 experts,
// top-2): a run stopped after step 3 and resumed continues as a straight 6-step run would.
//
// At the same (world, ep) the resume is bitwise (final loss, eval loss, the 17-digit param
// checksum) in every --dist mode: the same collectives add the same numbers in the same order.
//
// Across (world, ep) it is not bitwise, and no run at another (world, ep) is either: an expert's
// gradient is summed in another order (at ep 1 each rank's GEMM over its own tokens, then the
// data-parallel all-reduce; at ep > 1 one GEMM over the tokens the all-to-all gathered from the ep
// group), and a last-bit difference can flip a near-tie in the router's top-k, which moves a
// token to another expert: straight 6-step runs at (4, ep 2), (4, ep 4), (4, ep 1), (2, ep 1),
// (2, ep 2) and (1, ep 1) with the same micro-batches end within 2.7e-4 of each other in final
// loss. So across (world, ep) the test checks:
//   - the params loaded are the saved ones: the resumed run's initial eval loss equals the saving
//     run's final eval loss as printed (6 decimals) on the same eval windows (--eval_batches keeps
//     dp x eval_batches x micro-batch fixed); a forward pass differs only by rounding (measured: no
//     difference in the 6 printed decimals), a wrong or missing expert by far more;
//   - training goes on as a straight run would: final loss within kCrossEpLossBound = 1e-3 of the
//     straight run's (measured: 1.3e-5 after 3 resumed steps; ~4x the spread between straight
//     runs above, and 1/100 of what one step lowers the loss by here, ~0.1, so a resume that lost
//     its optimizer state or its data position is caught).
// The exact resharding itself (every param and optimizer state tensor bitwise after a resume at
// any (world, ep)) is checked with controlled gradients by //checkpoint:expert_checkpoint_test.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/testing/pretrain_runner.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::integration::testing::JsonField;
using ::orthoshard::integration::testing::JsonNumber;
using ::orthoshard::integration::testing::LastLine;
using ::orthoshard::integration::testing::RunPretrain;
using ::orthoshard::integration::testing::RunResult;
using ::orthoshard::integration::testing::TempDir;

constexpr double kCrossEpLossBound = 1e-3;

// 6 steps of moe-tiny, a global batch of 8 sequences, clipping on (the default).
RunResult RunMoe(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--model=moe-tiny", "--steps=6",        "--eval_every=0",
                                   "--check_every=0",  "--global_batch=8", "--warmup_steps=2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunPretrain(args);
}

std::string Fresh(const std::string& name) {
  const std::string dir = TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// Straight vs stopped after step 3 and resumed, at 2 ranks ep 2 (each rank holds 4 of the 8
// experts; expt_dp 1), in `dist` mode: bitwise.
void ExpectBitwiseResume(const std::vector<std::string>& mode) {
  const std::string dir = Fresh(absl::StrCat("bitwise_", mode[0].substr(7)));
  std::vector<std::string> common = {"--nproc_per_node=2", "--ep=2"};
  common.insert(common.end(), mode.begin(), mode.end());
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return RunMoe(extra);
  };
  const RunResult straight = with({});
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  const RunResult first = with({"--stop_after=3", "--save_dir=" + dir});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const RunResult resumed = with({"--resume", "--save_dir=" + dir});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const std::string a = LastLine(straight.out), b = LastLine(resumed.out);
  EXPECT_EQ(JsonField(b, "steps"), "6");
  EXPECT_EQ(JsonField(a, "final_loss"), JsonField(b, "final_loss"));
  EXPECT_EQ(JsonField(a, "eval_loss"), JsonField(b, "eval_loss"));
  ASSERT_FALSE(JsonField(a, "param_checksum").empty()) << a;
  EXPECT_EQ(JsonField(a, "param_checksum"), JsonField(b, "param_checksum"));
}

TEST(MoeResume, LayerwiseIsBitwiseAtTheSameWorldAndEp) {
  ExpectBitwiseResume({"--dist=layerwise"});
}

TEST(MoeResume, ReplicatedIsBitwiseAtTheSameWorldAndEp) {
  ExpectBitwiseResume({"--dist=replicated"});
}

TEST(MoeResume, DistOptAdamWIsBitwiseAtTheSameWorldAndEp) {
  ExpectBitwiseResume({"--dist=distopt", "--optimizer=adamw"});
}

TEST(MoeResume, FsdpIsBitwiseAtTheSameWorldAndEp) { ExpectBitwiseResume({"--dist=fsdp"}); }

// A resumed run against the straight run at the saving (world, ep): bitwise when `same`, else the
// loaded params evaluate as the saved ones did and the final loss is within kCrossEpLossBound.
void ExpectResumeMatches(const RunResult& straight, const RunResult& saving,
                         const RunResult& resumed, bool same) {
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const std::string a = LastLine(straight.out), b = LastLine(resumed.out);
  EXPECT_EQ(JsonField(b, "steps"), "6") << b;
  EXPECT_EQ(JsonField(b, "initial_eval_loss"), JsonField(LastLine(saving.out), "eval_loss")) << b;
  if (same) {
    EXPECT_EQ(JsonField(a, "param_checksum"), JsonField(b, "param_checksum")) << b;
    EXPECT_EQ(JsonField(a, "final_loss"), JsonField(b, "final_loss")) << b;
  } else {
    EXPECT_NEAR(JsonNumber(b, "final_loss"), JsonNumber(a, "final_loss"), kCrossEpLossBound) << b;
  }
}

// Saved at 4 ranks ep 2 (expt_dp 2: each expert's shards split between two copies), resumed at 2
// ranks ep 1 and ep 2, at 4 ranks ep 4 and ep 2, and at 1 rank. Every run keeps micro-batches of 2
// sequences (the load-balancing loss is per micro-batch, so its token sets must match) and reads
// the same 8 eval windows (dp x eval_batches x 2 with eval_batches = micro_batches).
TEST(MoeResume, SavedAtFourRanksEpTwoResumesAtOtherWorldsAndEps) {
  const std::string dir = Fresh("w4ep2");
  const std::vector<std::string> saved_at = {"--nproc_per_node=4", "--ep=2", "--eval_batches=1"};
  std::vector<std::string> args = saved_at;
  const RunResult straight = RunMoe(args);
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  args.insert(args.end(), {"--stop_after=3", "--save_dir=" + dir});
  const RunResult saving = RunMoe(args);
  ASSERT_EQ(saving.exit_code, 0) << saving.out << saving.err;
  struct Target {
    int world, ep, micro_batches;
  };
  for (const Target& t : {Target{2, 1, 2}, Target{2, 2, 2}, Target{4, 4, 1}, Target{1, 1, 4},
                          Target{4, 2, 1}}) {
    SCOPED_TRACE(absl::StrCat("resumed at ", t.world, " ranks ep ", t.ep));
    const std::string copy = Fresh(absl::StrCat("w4ep2_to_w", t.world, "ep", t.ep));
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    const RunResult resumed =
        RunMoe({absl::StrCat("--nproc_per_node=", t.world), absl::StrCat("--ep=", t.ep),
             absl::StrCat("--micro_batches=", t.micro_batches),
             absl::StrCat("--eval_batches=", t.micro_batches),
             "--resume", "--save_dir=" + copy});
    ExpectResumeMatches(straight, saving, resumed, t.world == 4 && t.ep == 2);
  }
}

// Saved at 2 ranks ep 2 (each rank holds other experts), resumed on 1 rank with every expert.
TEST(MoeResume, SavedAtTwoRanksEpTwoResumesOnOneRank) {
  const std::string dir = Fresh("w2ep2");
  const RunResult straight = RunMoe({"--nproc_per_node=2", "--ep=2", "--eval_batches=1"});
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  const RunResult saving = RunMoe({"--nproc_per_node=2", "--ep=2", "--eval_batches=1",
                                "--stop_after=3", "--save_dir=" + dir});
  ASSERT_EQ(saving.exit_code, 0) << saving.out << saving.err;
  const RunResult resumed = RunMoe({"--nproc_per_node=1", "--micro_batches=2", "--eval_batches=2",
                                 "--resume", "--save_dir=" + dir});
  ExpectResumeMatches(straight, saving, resumed, /*same=*/false);
}

}  // namespace
}  // namespace orthoshard::integration
