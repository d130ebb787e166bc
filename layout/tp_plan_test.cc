// Tests of the tensor-parallel Muon planning table: the FLOP count of one matrix, the logical
// matrices of a tp slice, a small case checked by hand, the conservation laws over the grid on
// every preset (owner's total = tp 1's, duplicated's = tp times it), and the named errors.
#include "layout/tp_plan.h"

#include <map>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layout/presets.h"
#include "layout/tp_homes.h"

namespace orthoshard::layout {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

ParamSpec Matrix(std::string name, std::vector<int64_t> global_shape, int dim, int64_t parts,
                 int tp) {
  ParamSpec p;
  p.name = std::move(name);
  p.role = ParamRole::kMuon;
  p.tp.dim = dim;
  p.tp.parts = parts;
  p.tp.size = tp;
  p.shape = TpLocalShape(std::move(global_shape), p.tp);
  return p;
}

TpPlanOptions Options(int tp, int dp) {
  TpPlanOptions o;
  o.tp = tp;
  o.layout.dp = dp;
  o.layout.bucket_size = std::nullopt;
  return o;
}

TEST(NsFlopsTest, DirectIterationMatmuls) {
  // [2, 3]: m = 2, n = 3: X Xᵀ 2·4·3 = 24, A·A 2·8 = 16, B X 24: 64 per step.
  EXPECT_EQ(NsFlops(2, 3, 1), 64);
  EXPECT_EQ(NsFlops(3, 2, 5), 320);  // transposed: the same products
  EXPECT_EQ(NsFlops(4096, 4096, 5), int64_t{30} * 4096 * 4096 * 4096);
}

TEST(TpLocalBlocksTest, QkvByGroupsFc1ByHalvesRowParallelUnchanged) {
  TpSplit qkv{0, 1, 2, 0};
  EXPECT_EQ(*TpLocalBlocks({4, {32, 8, 8}}, qkv, "qkv"), (FusedBlocks{2, {32, 8, 8}}));
  TpSplit fc1{0, 2, 4, 1};
  EXPECT_EQ(*TpLocalBlocks({1, {64, 64}}, fc1, "fc1"), (FusedBlocks{1, {16, 16}}));
  TpSplit proj{1, 1, 4, 0};
  EXPECT_EQ(*TpLocalBlocks({2, {8, 8}}, proj, "proj"), (FusedBlocks{2, {8, 8}}));
  EXPECT_EQ(*TpLocalBlocks({}, qkv, "w"), FusedBlocks{});
  TpSplit four{0, 1, 4, 0};
  EXPECT_THAT(TpLocalBlocks({2, {32, 8, 8}}, four, "param 'qkv'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'qkv': tp slices (dim 0, 1 part, rank 0 of 4) do not hold whole "
                       "logical matrices of its fused split (2 groups x [32, 8, 8] rows)"));
}

TEST(TpPlanTest, TwoMatricesAtTp2ByHand) {
  // A [8, 4] column-parallel (local [4, 4]), B [4, 16] row-parallel (local [4, 8]), dp 1.
  const std::vector<ParamSpec> params = {Matrix("a", {8, 4}, 0, 1, 2),
                                         Matrix("b", {4, 16}, 1, 1, 2)};
  ASSERT_OK_AND_ASSIGN(const TpPlan plan, PlanTpMuon(params, {}, Options(2, 1)));
  // 5 steps of 4 m² n + 2 m³: A (m 4, n 8) 5·(512 + 128) = 3200; B (m 4, n 16) 5·(1024 + 128) =
  // 5760. Costs max·min²: A 8·16 = 128, B 16·16 = 256, so B's home is rank 0 and A's rank 1.
  EXPECT_EQ(AssignTpHomes({128, 256}, 2), (std::vector<int>{1, 0}));
  EXPECT_EQ(plan.owner.rank_ns_flops, (std::vector<int64_t>{5760, 3200}));
  EXPECT_EQ(plan.owner.total_ns_flops, 8960);
  EXPECT_EQ(plan.owner.max_ns_flops, 5760);
  EXPECT_DOUBLE_EQ(plan.owner.ns_imbalance, 5760.0 / 4480.0);
  EXPECT_EQ(plan.duplicated.rank_ns_flops, (std::vector<int64_t>{8960, 8960}));
  // Local: A [4, 4] 5·(256 + 128) = 1920; B [4, 8] 5·(512 + 128) = 3200.
  EXPECT_EQ(plan.blockwise.rank_ns_flops, (std::vector<int64_t>{5120, 5120}));
  // fp32 shards of 16 (A) and 32 (B) elements. Owner: rank 0 sends A's shard to rank 1 (64 B)
  // and B's other shard back (128 B); rank 1 sends B's shard (128 B) and A's back (64 B).
  // Duplicated: each rank sends its shard of both to the other: 192 B. At tp 2 they are equal.
  EXPECT_EQ(plan.owner.rank_tp_bytes, (std::vector<int64_t>{192, 192}));
  EXPECT_EQ(plan.duplicated.rank_tp_bytes, (std::vector<int64_t>{192, 192}));
  EXPECT_EQ(plan.blockwise.rank_tp_bytes, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(plan.dp_bytes, 0);  // dp 1
  EXPECT_EQ(plan.tp_split_matrices, 2);
  EXPECT_EQ(plan.replicated_matrices, 0);
}

TEST(TpPlanTest, OwnerTrafficFallsAsTwoOverTp) {
  // 4 equal [64, 64] matrices at tp 4, dp 1: one home each. A home sends 3 shards of 1024 fp32
  // elements back (12288 B), the 3 other matrices' shards to their homes (3 · 4096 B): 24576 B.
  // Duplicated: every rank sends its shard of 4 matrices to 3 ranks: 4 · 3 · 4096 = 49152 B, so
  // owner / duplicated = 2 / tp.
  std::vector<ParamSpec> params;
  for (int i = 0; i < 4; ++i) params.push_back(Matrix("w" + std::to_string(i), {64, 64}, 0, 1, 4));
  ASSERT_OK_AND_ASSIGN(const TpPlan plan, PlanTpMuon(params, {}, Options(4, 1)));
  EXPECT_EQ(plan.owner.rank_tp_bytes, (std::vector<int64_t>(4, 24576)));
  EXPECT_EQ(plan.duplicated.rank_tp_bytes, (std::vector<int64_t>(4, 49152)));
  EXPECT_EQ(plan.owner.rank_ns_flops, (std::vector<int64_t>(4, NsFlops(64, 64, 5))));
  EXPECT_DOUBLE_EQ(plan.owner.ns_imbalance, 1.0);
}

TEST(TpPlanTest, DpTrafficIsTheRingOverEveryBucket) {
  // One bf16 param of 256 elements with fp32 grads at dp 2 in one bucket: 2 shards of 128; each
  // rank sends 128 grad elements (4 B) in the reduce-scatter and 128 param elements (2 B) in the
  // all-gather: 768 B.
  ParamSpec norm;
  norm.name = "norm";
  norm.shape = {256};
  ASSERT_OK_AND_ASSIGN(const TpPlan plan, PlanTpMuon({norm}, {}, Options(2, 2)));
  EXPECT_EQ(plan.dp_bytes, 768);
  EXPECT_EQ(plan.owner.total_ns_flops, 0);
  EXPECT_DOUBLE_EQ(plan.owner.ns_imbalance, 1.0);
}

TEST(TpPlanTest, FusedBlocksCountedPerLogicalMatrix) {
  // QKV of 2 groups x {4 q rows, 2 k, 2 v} at C 8 (global [16, 8]) at tp 2: home runs Q [8, 8],
  // K [4, 8], V [4, 8]; blockwise each rank Q [4, 8], K [2, 8], V [2, 8] of its one group.
  const std::vector<ParamSpec> params = {Matrix("qkv", {16, 8}, 0, 1, 2)};
  const std::map<std::string, FusedBlocks> splits = {{"qkv", {2, {4, 2, 2}}}};
  ASSERT_OK_AND_ASSIGN(const TpPlan plan, PlanTpMuon(params, splits, Options(2, 1)));
  const int64_t global = NsFlops(8, 8, 5) + 2 * NsFlops(4, 8, 5);
  const int64_t local = NsFlops(4, 8, 5) + 2 * NsFlops(2, 8, 5);
  EXPECT_EQ(plan.owner.rank_ns_flops, (std::vector<int64_t>{global, 0}));
  EXPECT_EQ(plan.duplicated.rank_ns_flops, (std::vector<int64_t>{global, global}));
  EXPECT_EQ(plan.blockwise.rank_ns_flops, (std::vector<int64_t>{local, local}));
}

TEST(TpPlanTest, TpOneHasOneAnswer) {
  ASSERT_OK_AND_ASSIGN(const std::vector<ParamSpec> params, PresetParams("gpt2-124m", 1));
  ASSERT_OK_AND_ASSIGN(const auto splits, PresetSplits("gpt2-124m"));
  ASSERT_OK_AND_ASSIGN(const TpPlan plan, PlanTpMuon(params, splits, Options(1, 4)));
  EXPECT_EQ(plan.owner.rank_ns_flops, plan.duplicated.rank_ns_flops);
  EXPECT_EQ(plan.owner.rank_ns_flops, plan.blockwise.rank_ns_flops);
  EXPECT_EQ(plan.owner.max_tp_bytes, 0);
  EXPECT_EQ(plan.duplicated.max_tp_bytes, 0);
  // 12 layers x (Q, K, V, proj [768, 768], gate, up [2048, 768], fc2 [768, 2048]).
  const int64_t layer = 4 * NsFlops(768, 768, 5) + 3 * NsFlops(2048, 768, 5);
  EXPECT_EQ(plan.owner.total_ns_flops, 12 * layer);
}

// Owner mode runs every TP-split matrix once in the grid: its total equals tp 1's exactly, while
// duplicated runs it on every tp rank (tp times). Params every tp rank holds whole (the MoE
// router, routed to Muon in moe_60x256) run on every tp rank in every mode: tp - 1 extra copies.
TEST(TpPlanTest, OwnerTotalIsTpOnesDuplicatedIsTpTimesOnEveryPreset) {
  for (const std::string& preset : PresetNames()) {
    ASSERT_OK_AND_ASSIGN(const auto splits, PresetSplits(preset));
    ASSERT_OK_AND_ASSIGN(const std::vector<ParamSpec> whole, PresetParams(preset, 1));
    for (int dp : {1, 3, 8}) {
      TpPlanOptions options = Options(1, dp);
      options.layout.bucket_size = int64_t{40000000};
      ASSERT_OK_AND_ASSIGN(const TpPlan one, PlanTpMuon(whole, splits, options));
      for (int tp : {2, 4}) {
        SCOPED_TRACE(preset + " tp " + std::to_string(tp) + " dp " + std::to_string(dp));
        ASSERT_OK_AND_ASSIGN(const std::vector<ParamSpec> params, PresetParams(preset, tp));
        options.tp = tp;
        ASSERT_OK_AND_ASSIGN(const TpPlan plan, PlanTpMuon(params, splits, options));
        const int64_t router = preset == "moe_60x256" ? 60 * NsFlops(256, 2048, 5) : 0;
        EXPECT_EQ(plan.replicated_matrices, preset == "moe_60x256" ? 60 : 0);
        EXPECT_EQ(plan.owner.total_ns_flops, one.owner.total_ns_flops + (tp - 1) * router);
        EXPECT_EQ(plan.duplicated.total_ns_flops, tp * one.owner.total_ns_flops);
        EXPECT_LE(plan.blockwise.total_ns_flops, plan.owner.total_ns_flops);
        EXPECT_EQ(plan.tp_split_matrices + plan.replicated_matrices,
                  one.replicated_matrices);  // at tp 1 no matrix is split
      }
    }
  }
}

TEST(TpPlanTest, NamedErrors) {
  const std::vector<ParamSpec> params = {Matrix("a", {8, 4}, 0, 1, 2)};
  EXPECT_THAT(PlanTpMuon(params, {}, Options(4, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'a': split over a tp group of 2, the plan's tp is 4"));
  EXPECT_THAT(PlanTpMuon(params, {}, Options(0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "--tp is 0; expected 1 to 2^20"));
  TpPlanOptions distopt = Options(2, 1);
  distopt.layout.muon_strategy = Strategy::kDistOpt;
  EXPECT_THAT(PlanTpMuon(params, {}, distopt),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Muon needs whole matrices")));
  TpPlanOptions expert = Options(2, 4);
  expert.layout.expert_dp = 2;
  EXPECT_THAT(PlanTpMuon(params, {}, expert),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--expert_dp is 2; the tp plan needs 0 or --dp (4)")));
  TpPlanOptions steps = Options(2, 1);
  steps.ns_steps = 0;
  EXPECT_THAT(PlanTpMuon(params, {}, steps),
              StatusIs(absl::StatusCode::kInvalidArgument, "--ns_steps is 0; expected 1 to 99"));
  EXPECT_THAT(PlanTpMuon(params, {{"b", {1, {4, 4}}}}, Options(2, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "fused split for 'b': no Muon param of that name"));
  EXPECT_THAT(PlanTpMuon(params, {{"a", {1, {4, 2}}}}, Options(2, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'a': fused split 1 groups x 6 rows = 6 rows, weight has 8"));
  EXPECT_THAT(PlanTpMuon(params, {{"a", {1, {2, 6}}}}, Options(2, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("do not hold whole logical matrices")));
  ParamSpec odd = Matrix("odd", {8, 4}, 0, 3, 4);  // 8 rows: not 3 parts x 4 equal slices
  EXPECT_THAT(PlanTpMuon({odd}, {}, Options(4, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'odd': dim 0 of shape [8, 4] (8) does not split into 3 "
                                 "part(s) x tp 4")));
}

TEST(PresetTpTest, SplitsAndNamedRefusals) {
  ASSERT_OK_AND_ASSIGN(const std::vector<ParamSpec> llama, PresetParams("llama3_8b_gqa", 8));
  // qkv (32 + 16) x 128 rows by KV group: 768 per rank; fc1 2 x 14336 / 8; proj and fc2 by
  // columns; embedding by vocabulary; norms whole.
  auto find = [&](const std::string& name) {
    for (const ParamSpec& p : llama) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << name;
    return ParamSpec{};
  };
  EXPECT_EQ(find("decoder.layers.0.self_attention.linear_qkv.weight").shape,
            (std::vector<int64_t>{768, 4096}));
  EXPECT_EQ(find("decoder.layers.0.self_attention.linear_proj.weight").shape,
            (std::vector<int64_t>{4096, 512}));
  EXPECT_EQ(find("decoder.layers.0.mlp.linear_fc1.weight").shape,
            (std::vector<int64_t>{3584, 4096}));
  EXPECT_EQ(find("decoder.layers.0.mlp.linear_fc1.weight").tp.parts, 2);
  EXPECT_EQ(find("decoder.layers.0.mlp.linear_fc2.weight").shape,
            (std::vector<int64_t>{4096, 1792}));
  EXPECT_EQ(find("embedding.word_embeddings.weight").shape, (std::vector<int64_t>{16032, 4096}));
  EXPECT_EQ(find("decoder.layers.0.input_layernorm.weight").shape, (std::vector<int64_t>{4096}));
  EXPECT_FALSE(find("decoder.layers.0.input_layernorm.weight").tp.split());
  ASSERT_OK_AND_ASSIGN(const auto splits, PresetSplits("llama3_8b_gqa"));
  EXPECT_EQ(splits.at("decoder.layers.0.self_attention.linear_qkv.weight"),
            (FusedBlocks{8, {512, 128, 128}}));
  EXPECT_EQ(splits.at("decoder.layers.0.mlp.linear_fc1.weight"), (FusedBlocks{1, {14336, 14336}}));

  EXPECT_THAT(PresetParams("gpt2-124m", 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "preset 'gpt2-124m' at --tp=8: the KV groups (attention query groups) 12 "
                       "does not split over 8 tp ranks; expected tp to divide 12"));
  EXPECT_THAT(PresetParams("tinyllama-1.1b", 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KV groups")));
  EXPECT_THAT(PresetParams("gpt2-124m", 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the FFN width 2048 does not split over 3")));
  EXPECT_THAT(PresetParams("moe_60x256", 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KV groups")));
  EXPECT_THAT(PresetParams("gpt8b", 0), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 "preset 'gpt8b': --tp is 0; expected 1 to 2^20"));
}

}  // namespace
}  // namespace orthoshard::layout
