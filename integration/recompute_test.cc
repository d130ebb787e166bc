// `pretrain --recompute` end to end, 2 real ranks on loopback: activation recompute changes when
// activations are computed, not what is computed. The recomputed block or attention core runs the
// same ops on the same values in backward (model:recompute_test checks the model bitwise), so a
// recomputed run is bitwise the run without it in every --dist mode: the same losses and the same
// params (the checksum printed with 17 digits).
//
// Under --dist=fsdp the recompute reads the block's params gathered by the pre-backward hook that
// the backward without recompute uses too: one gather per layer in backward, not two. A second
// gather would be logical bytes launched on top of the run without recompute; the runs launch the
// same bytes per step.
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/testing/pretrain_runner.h"

namespace orthoshard::integration {
namespace {

using testing::ExpectRefusedBeforeLaunch;
using testing::ExpectSameTraining;
using testing::JsonField;
using testing::JsonNumber;
using testing::Pretrain;
using testing::TrainingRun;
using testing::With;
using ::testing::HasSubstr;

const std::vector<std::string>& kSameRun = testing::kSameTraining;

// 3 steps of `tiny` at 2 ranks, two micro-batches each (gradients accumulated over two
// backward passes).
const std::vector<std::string> kShort = {"--model=tiny",     "--steps=3",
                                         "--global_batch=8", "--micro_batches=2",
                                         "--eval_every=0",   "--check_every=3",
                                         "--warmup_steps=1"};

// Each --dist mode (distopt needs AdamW; the others run Muon): --recompute=full and
// --recompute=selective train bitwise as none. `extra`: more flags for both.
void ExpectRecomputeChangesNothing(const std::string& dist,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = With(With(kShort, {"--dist=" + dist}), extra);
  if (dist == "distopt") args.push_back("--optimizer=adamw");
  const TrainingRun none = Pretrain(args);
  EXPECT_EQ(JsonField(none.json, "recompute"), "none");
  EXPECT_EQ(JsonField(none.json, "recompute_layers"), "");  // every block: left out
  for (const std::string mode : {"full", "selective"}) {
    const TrainingRun recomputed = Pretrain(With(args, {"--recompute=" + mode}));
    EXPECT_EQ(JsonField(recomputed.json, "recompute"), mode);
    EXPECT_THAT(recomputed.out, HasSubstr("recompute " + mode));
    ExpectSameTraining(none, recomputed, "--dist=" + dist + " --recompute=" + mode, kSameRun);
    // The same collectives: recompute gathers nothing more (fsdp) and reduces nothing more.
    EXPECT_EQ(JsonField(recomputed.json, "comm_bytes_per_step"),
              JsonField(none.json, "comm_bytes_per_step"))
        << "--dist=" << dist << " --recompute=" << mode;
  }
}

TEST(RecomputePretrain, ReplicatedIsBitwiseNoRecompute) {
  ExpectRecomputeChangesNothing("replicated");
}
TEST(RecomputePretrain, LayerwiseIsBitwiseNoRecompute) {
  ExpectRecomputeChangesNothing("layerwise");
}
TEST(RecomputePretrain, DistOptIsBitwiseNoRecompute) { ExpectRecomputeChangesNothing("distopt"); }
// tiny's default layout puts both blocks' matrices in one bucket (gathered once for both in
// backward); 4 Muon buckets of 49152, 24576, 49152 and 24576 elements give each block its own, so
// each block is gathered in its own backward, which the recompute then reads.
TEST(RecomputePretrain, FsdpIsBitwiseNoRecomputeWithOneGatherPerLayer) {
  ExpectRecomputeChangesNothing("fsdp", {"--min_buckets=8", "--max_bucket_padding=0.5"});
}

// An MoE model with expert parallelism under fsdp: the recomputed blocks run their all-to-alls
// again in backward (both ranks at the same point); the aux losses get their gradients through
// the recompute; only the first of the 4 blocks recomputed. The bytes launched over the run grow
// by the repeated all-to-alls exactly (each step's from the TensorBoard scalars, exact as floats
// below 2^24): the gathers and reductions stay the same.
TEST(RecomputePretrain, ExpertParallelMoeIsBitwiseNoRecompute) {
  const std::vector<std::string> args =
      With(kShort, {"--model=moe-tiny", "--ep=2", "--dist=fsdp"});
  const TrainingRun none = Pretrain(args, "moe_none_");
  const TrainingRun first =
      Pretrain(With(args, {"--recompute=full", "--recompute_layers=1"}), "moe_full_");
  EXPECT_EQ(JsonField(first.json, "recompute_layers"), "1");
  EXPECT_THAT(first.out, HasSubstr("recompute full (the first 1 blocks)"));
  ExpectSameTraining(none, first, "moe-tiny --ep=2 --recompute=full --recompute_layers=1",
                     With(kSameRun, {"moe_aux_loss", "moe_z_loss"}));
  const std::vector<float>& a = none.scalars.at("comm/all_to_all_bytes");
  const std::vector<float>& b = first.scalars.at("comm/all_to_all_bytes");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  double all_to_all_extra = 0;
  for (size_t step = 0; step < a.size(); ++step) {
    ASSERT_LT(b[step], 1 << 24) << "step " << step + 1 << ": not exact as a float";
    all_to_all_extra += static_cast<double>(b[step]) - a[step];
  }
  EXPECT_GT(all_to_all_extra, 0);
  EXPECT_EQ(JsonNumber(first.json, "comm_bytes") - JsonNumber(none.json, "comm_bytes"),
            all_to_all_extra);
}

// Bad recompute input: exit 2 with one message on stderr, before any rank starts.
TEST(RecomputePretrain, BadInputExitsWithTwoAndOneMessage) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--recompute=bogus", "--recompute 'bogus': expected none, full or selective"},
      {"--recompute=full --recompute_layers=0",
       "--recompute_layers 0 must be in [1, 2] (model 'tiny' has 2 layers)"},
      {"--recompute=selective --model=small --recompute_layers=5",
       "--recompute_layers 5 must be in [1, 4] (model 'small' has 4 layers)"},
      {"--recompute_layers=1", "--recompute_layers 1 needs --recompute=full or"},
  };
  ExpectRefusedBeforeLaunch(cases);
}

}  // namespace
}  // namespace orthoshard::integration
