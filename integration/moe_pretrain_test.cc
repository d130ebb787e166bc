// `pretrain --model=moe-tiny` end to end, real ranks on loopback: what expert parallelism must not
// change, mirroring the dense claims of pretrain_test and fsdp_test.
//
// What is bitwise, and why. At the same world and global batch, --ep changes only where an
// expert's rows are computed. The forward reduces nothing in another order (the router and the
// attention are each rank's own ops; an expert's product computes every row on its own once it
// has 4 or more rows, model/moe_test's claim, checked there bitwise on the logits and every dense
// gradient), so step 1's loss, aux losses and routing are the same. An expert's gradient is one
// product over both ranks' rows at ep 2 but two per-rank products added by the grad sync at ep 1:
// the same sum in another order, so from step 2 on the params differ in their last bits (the
// measured budgets are at EpTwoTracksEpOne). Between --dist modes at the same ep nothing changes
// order where the dense tests say so: layerwise = fsdp (also with clipping), layerwise =
// replicated with Muon and clipping off, and with AdamW layerwise = distopt = fsdp; and 1 rank
// with 2 micro-batches = 2 ranks (micro-batch m is rank m's slice; the aux losses are scaled by
// 1/2 either way, exactly). At a dense dp of 2 that holds whatever the modes' bucket layouts (two
// addends round once in either order); at dp >= 3 (FourRanksAsEpTwoByExpertDpTwo) only over the
// same layout, so the runs compared there name one --bucket_elems: the ring reduce-scatter adds
// an element's terms in an order that depends on the shard it falls in.
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
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
using testing::Scalars;
using testing::With;
using ::testing::HasSubstr;

using MoeRun = testing::TrainingRun;

// pretrain --model=moe-tiny with `args`; the TensorBoard scalars when `tb` names a log dir.
MoeRun MoePretrain(std::vector<std::string> args, const std::string& tb = "") {
  args.insert(args.begin(), "--model=moe-tiny");
  return Pretrain(std::move(args), tb);
}

// The fields two runs of the same steps must agree on to be the same training, bitwise (the
// checksum is the exact sum of every param, printed with 17 digits).
const std::vector<std::string> kSameRun = {"steps",        "initial_loss",   "final_loss",
                                           "eval_loss",    "param_checksum", "moe_aux_loss",
                                           "moe_z_loss",   "expert_load_max", "expert_load_min"};

// At another rank count the eval loss is over that count's eval slices: not compared.
const std::vector<std::string> kSameTrainingSteps = {
    "steps",      "initial_loss",    "final_loss",     "param_checksum", "moe_aux_loss",
    "moe_z_loss", "expert_load_max", "expert_load_min"};

// The expert loads of every layer at every step: the routing decisions' per-expert counts.
std::vector<std::string> LoadTags(const Scalars& s) {
  std::vector<std::string> tags;
  for (const auto& [tag, values] : s) {
    if (tag.rfind("moe/layer", 0) == 0) tags.push_back(tag);
  }
  return tags;
}

const std::vector<std::string> kShort = {"--steps=4",         "--global_batch=16",
                                         "--eval_every=0",    "--check_every=2",
                                         "--warmup_steps=1",  "--max_grad_norm=0",
                                         "--muon_ns_dtype=fp32"};

// ep 2 against ep 1 at 2 ranks, the same global batch and seed, 4 steps, Muon with fp32
// Newton-Schulz (in bf16, a last-bit difference of its input flips bf16 roundings and moves the
// update by ~2^-8 relative, as pretrain_test's layerwise/replicated comment measures) and no
// clipping (the same global norm in another order). Bitwise: step 1's loss, aux losses and
// routing (TensorBoard floats, and the JSON's digits at --steps=1 below), and the expert loads of
// every layer at every step (the differences of later steps, ~1e-8 of a param, are far from
// flipping any of the 4 x 1024 routing decisions a step: measured identical in every run).
// Budgets, not derived bounds, for what follows step 1: the reduction-order difference of the
// expert gradients (each element within 2 gamma_1024 = 1.2e-4 of its terms' magnitude, typically
// sqrt(1024) u = 2e-6) passes through Newton-Schulz, whose sensitivity has no useful a-priori
// bound. Measured: the losses of steps 2-4 and the grad norms agree to float precision (<= 2e-7
// relative), the final param checksum (~580) to 7e-6; the budgets are 1e-5 relative and 1e-6 of
// the checksum (~6e-4), 50-100x the measurements and ~100x below what leaving one expert matrix
// un-updated moves the checksum (sqrt(8192) x lr 0.02 x ~0.1 per entry ~ 0.2). Also 1 rank with 2
// micro-batches = 2 ranks at ep 1, bitwise.
TEST(MoePretrain, EpTwoTracksEpOne) {
  const MoeRun ep1 = MoePretrain(kShort, "ep1_");
  const MoeRun ep2 = MoePretrain(With(kShort, {"--ep=2"}), "ep2_");
  const MoeRun one = MoePretrain(With(kShort, {"--nproc_per_node=1", "--micro_batches=2"}));
  ExpectSameTraining(ep1, one, "2 ranks vs 1 rank x 2 micro-batches, ep 1", kSameTrainingSteps);
  EXPECT_EQ(JsonField(ep1.json, "checksum_checks"), "2");
  EXPECT_EQ(JsonField(ep2.json, "checksum_checks"), "2");  // experts compared over expt_dp too
  EXPECT_EQ(JsonNumber(ep1.json, "all_to_all_bytes_per_step"), 0);
  EXPECT_GT(JsonNumber(ep2.json, "all_to_all_bytes_per_step"), 0);
  EXPECT_EQ(JsonField(ep1.json, "num_params"), "477760");  // GptParamCount: every expert
  EXPECT_EQ(JsonField(ep2.json, "num_params"), "477760");
  EXPECT_THAT(ep1.out, HasSubstr("model moe-tiny (477760 params), data"));
  // Dense 84544 + half of the experts' 393216 on each rank.
  EXPECT_THAT(ep2.out, HasSubstr("model moe-tiny (477760 params, 281152 per rank at ep 2), data"));
  const Scalars& a = ep1.scalars;
  const Scalars& b = ep2.scalars;
  for (const char* tag : {"train/loss", "moe/aux_loss", "moe/z_loss"}) {
    ASSERT_EQ(a.at(tag).size(), 4u) << tag;
    ASSERT_EQ(b.at(tag).size(), 4u) << tag;
    EXPECT_EQ(a.at(tag)[0], b.at(tag)[0]) << tag << " at step 1";
  }
  const std::vector<std::string> loads = LoadTags(a);
  ASSERT_EQ(loads.size(), 8u);  // load_max and load_min of 4 layers
  EXPECT_EQ(LoadTags(b), loads);
  for (const std::string& tag : loads) EXPECT_EQ(a.at(tag), b.at(tag)) << tag;
  for (const char* tag : {"train/loss", "train/grad_norm", "moe/aux_loss", "moe/z_loss"}) {
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_NEAR(a.at(tag)[s], b.at(tag)[s], 1e-5 * std::abs(a.at(tag)[s]))
          << tag << " at step " << s + 1;
    }
  }
  EXPECT_NEAR(JsonNumber(ep1.json, "param_checksum"), JsonNumber(ep2.json, "param_checksum"),
              1e-6 * std::abs(JsonNumber(ep1.json, "param_checksum")));
  // Step 1 alone: the JSON's loss digits and loads, and the same routing.
  const std::vector<std::string> step1 = {"--steps=1", "--global_batch=16", "--eval_every=0",
                                          "--check_every=0"};
  const MoeRun first1 = MoePretrain(step1);
  const MoeRun first2 = MoePretrain(With(step1, {"--ep=2"}));
  for (const char* field : {"initial_loss", "final_loss", "initial_eval_loss", "moe_aux_loss",
                            "moe_z_loss", "expert_load_max", "expert_load_min"}) {
    EXPECT_EQ(JsonField(first1.json, field), JsonField(first2.json, field)) << field;
  }
}

// Every --dist mode with experts at 2 ranks, ep 2 (the expert buffers of one expt_dp rank each,
// dense buffers over both): the modes the dense tests prove bitwise equal stay so with experts.
// Muon, clipping on: layerwise = fsdp. Muon, clipping off: layerwise = fsdp = replicated. AdamW
// (clipping on): layerwise (all AdamW buffers are distopt) = distopt = fsdp. The default bf16
// Newton-Schulz: same inputs, same roundings.
TEST(MoePretrain, ModesAgreeBitwiseAtEpTwo) {
  const std::vector<std::string> common = {"--ep=2",          "--steps=3",
                                           "--global_batch=16", "--eval_every=2",
                                           "--eval_batches=1", "--check_every=0",
                                           "--warmup_steps=1"};
  const MoeRun clipped = MoePretrain(With(common, {"--dist=layerwise"}));
  ExpectSameTraining(clipped, MoePretrain(With(common, {"--dist=fsdp"})), "fsdp, Muon, clipped",
                     kSameRun);
  const MoeRun layerwise = MoePretrain(With(common, {"--dist=layerwise", "--max_grad_norm=0"}));
  ExpectSameTraining(layerwise, MoePretrain(With(common, {"--dist=fsdp", "--max_grad_norm=0"})),
                     "fsdp, Muon", kSameRun);
  const MoeRun replicated =
      MoePretrain(With(common, {"--dist=replicated", "--max_grad_norm=0", "--check_every=1"}));
  ExpectSameTraining(layerwise, replicated, "replicated, Muon", kSameRun);
  EXPECT_EQ(JsonField(replicated.json, "checksum_checks"), "3");
  const MoeRun adamw = MoePretrain(With(common, {"--dist=layerwise", "--optimizer=adamw"}));
  ExpectSameTraining(adamw, MoePretrain(With(common, {"--dist=distopt", "--optimizer=adamw"})),
                     "distopt, AdamW", kSameRun);
  ExpectSameTraining(adamw, MoePretrain(With(common, {"--dist=fsdp", "--optimizer=adamw"})),
                     "fsdp, AdamW", kSameRun);
  EXPECT_NE(JsonField(adamw.json, "param_checksum"), JsonField(layerwise.json, "param_checksum"));
}

// The step-1 gradient norm counts every param once at world 1, (2 ranks, ep 1), (2, ep 2),
// (4, ep 2 x expt_dp 2) and (4, ep 4), in the layer-wise (sharded statistics), replicated (each
// rank's saved elements once experts are split) and fsdp modes. The load-balancing loss is off:
// it is E sum f_e P_e of each rank's tokens, a product of per-rank means, so the objective itself
// depends on the rank count (the z-loss, a mean over equal slices, does not). Every gradient
// element is a sum over the global batch's 16 x 64 x 2 token copies in some order, within
// gamma_2048 = 1.2e-4 of its terms' magnitude in the worst case: the bound, relative. Measured
// 2e-7; counting the experts once per ep rank, or missing the other ranks' shards, moves the norm
// by tens of percent (the experts hold most of the gradient's mass; sqrt(2) for a doubled count).
TEST(MoePretrain, GradNormCountsEveryParamOnceAtEveryDpAndEp) {
  auto step1_norm = [](const std::string& dist, int world, int ep) {
    const MoeRun run = MoePretrain({dist, absl::StrCat("--nproc_per_node=", world),
                              absl::StrCat("--ep=", ep), "--steps=1", "--global_batch=16",
                              "--eval_every=0", "--check_every=0", "--moe_aux_loss_coeff=0"},
                             "norm_");
    EXPECT_EQ(run.scalars.count("train/grad_norm"), 1u) << run.json;
    return run.scalars.count("train/grad_norm") ? run.scalars.at("train/grad_norm")[0] : 0.0f;
  };
  const float single = step1_norm("--dist=layerwise", 1, 1);  // every mode is the same at 1 rank
  ASSERT_GT(single, 0);
  const float gamma = 2048 * 0x1p-24 / (1 - 2048 * 0x1p-24);
  for (const char* dist : {"--dist=layerwise", "--dist=replicated", "--dist=fsdp"}) {
    for (const auto& [world, ep] :
         std::vector<std::pair<int, int>>{{2, 1}, {2, 2}, {4, 2}, {4, 4}}) {
      // fsdp's statistics are layerwise's (the same shards): its 4-rank grids add nothing.
      if (std::string(dist) == "--dist=fsdp" && world == 4) continue;
      EXPECT_NEAR(step1_norm(dist, world, ep), single, gamma * single)
          << dist << " world " << world << " ep " << ep << " vs world 1";
    }
  }
}

// 4 ranks as ep 2 x expt_dp 2 (each expert's params sharded over 2 ranks, its tokens from all 4):
// the experts' copies agree over expt_dp at every check, layerwise = fsdp = replicated (clipping
// off) bitwise over one layout, and it tracks ep 1 and ep 4 at 4 ranks within EpTwoTracksEpOne's
// budgets. Replicated sums its dense grads over dp 4 in the ring's order too (a reduce-scatter and
// an all-gather); the engine's all-reduce it used before adds four terms in another order (an
// independent grid measured final losses up to 5.2e-5 apart at dp 4).
TEST(MoePretrain, FourRanksAsEpTwoByExpertDpTwo) {
  // One layout for both modes (fsdp's default sizes buckets from the model): at a dense dp of 4
  // the ring's order of an element's four terms depends on its shard.
  const std::vector<std::string> four =
      With(kShort, {"--nproc_per_node=4", "--check_every=1", "--bucket_elems=65536"});
  const MoeRun ep2 = MoePretrain(With(four, {"--ep=2"}));
  EXPECT_EQ(JsonField(ep2.json, "checksum_checks"), "4");
  EXPECT_EQ(JsonField(ep2.json, "world_size"), "4");
  ExpectSameTraining(ep2, MoePretrain(With(four, {"--ep=2", "--dist=fsdp"})),
                     "fsdp at 4 ranks, ep 2", kSameRun);
  ExpectSameTraining(ep2, MoePretrain(With(four, {"--ep=2", "--dist=replicated"})),
                     "replicated at 4 ranks, ep 2", kSameRun);
  for (const char* other : {"--ep=1", "--ep=4"}) {
    const MoeRun run = MoePretrain(With(four, {other}));
    EXPECT_EQ(JsonField(run.json, "expert_load_max"), JsonField(ep2.json, "expert_load_max")) << other;
    EXPECT_EQ(JsonField(run.json, "expert_load_min"), JsonField(ep2.json, "expert_load_min")) << other;
    EXPECT_NEAR(JsonNumber(run.json, "final_loss"), JsonNumber(ep2.json, "final_loss"),
                1e-5 * JsonNumber(ep2.json, "final_loss") + 1e-6)  // + the JSON's rounding
        << other;
    EXPECT_NEAR(JsonNumber(run.json, "param_checksum"), JsonNumber(ep2.json, "param_checksum"),
                1e-6 * std::abs(JsonNumber(ep2.json, "param_checksum")))
        << other;
  }
}

// Bad MoE input: exit 2 with one message on stderr, before any rank starts (nothing on stdout,
// nothing written).
TEST(MoePretrain, BadInputExitsWithTwoAndOneMessage) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model=moe-tiny --ep=3", "--ep 3 must be >= 1 and divide the world size 2"},
      {"--model=moe-tiny --ep=0", "--ep 0 must be >= 1 and divide the world size 2"},
      {"--model=moe-tiny --nproc_per_node=3 --global_batch=12 --ep=3",
       "--ep 3 does not divide model 'moe-tiny''s 8 experts per layer"},
      {"--model=moe-tiny --moe_top_k=9", "--moe_top_k 9 must be in [1, 8]"},
      {"--model=moe-tiny --moe_top_k=-1", "--moe_top_k -1 must be in [1, 8]"},
      {"--model=moe-tiny --moe_aux_loss_coeff=-0.5",
       "--moe_aux_loss_coeff must be in [0, 2^32] or -1, got -0.5"},
      {"--model=tiny --ep=2", "'tiny' is dense"},
      {"--model=small --moe_top_k=2", "'small' is dense"},
      {"--moe_z_loss_coeff=0.1", "'tiny' is dense"},
  };
  ExpectRefusedBeforeLaunch(cases);
}

}  // namespace
}  // namespace orthoshard::integration
