// The single-process parts of Muon for tensor-parallel matrices (optimizers/tp_muon.h): slices and
// their assembly against TpRuns' layout, the slices' FusedSplits (blockwise), the global block
// structure of the param update, and Muon's blockwise step of a split slot (no TpNewtonSchulz)
// against plain Muon on the slice with the slice's split. The exchange itself and owner /
// duplicated against single-process Muon are //optimizers/distributed:tp_muon_test.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/zeros.h>

#include "absl/status/status.h"
#include "common/testing/status_matchers.h"
#include "common/tp_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/muon.h"
#include "optimizers/tp_muon.h"

namespace orthoshard::optimizers {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

at::Tensor Values(std::vector<int64_t> shape, double phase) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return at::sin(at::arange(n, at::kFloat).mul_(0.37).add_(phase)).view(shape);
}

TEST(TpMuonTest, SlicesAssembleToTheGlobalMatrix) {
  // fc1-like [8, 3] in 2 parts over 2 ranks: rank 0 holds rows 0-1 and 4-5, rank 1 rows 2-3, 6-7.
  const at::Tensor global = Values({8, 3}, 0.1);
  const TpSplit fc1{0, 2, 2, 0};
  const at::Tensor r0 = TpSliceOf(global, fc1);
  const at::Tensor r1 = TpSliceOf(global, fc1.ForRank(1));
  EXPECT_TRUE(at::equal(r0.narrow(0, 0, 2), global.narrow(0, 0, 2)));
  EXPECT_TRUE(at::equal(r0.narrow(0, 2, 2), global.narrow(0, 4, 2)));
  EXPECT_TRUE(at::equal(r1.narrow(0, 2, 2), global.narrow(0, 6, 2)));
  EXPECT_TRUE(at::equal(AssembleTpMatrix({r0, r1}, fc1, {8, 3}), global));
  // Row-parallel [3, 8] along dim 1 over 4 ranks.
  const at::Tensor wide = Values({3, 8}, 0.2);
  const TpSplit fc2{1, 1, 4, 0};
  std::vector<at::Tensor> slices;
  for (int r = 0; r < 4; ++r) slices.push_back(TpSliceOf(wide, fc2.ForRank(r)));
  EXPECT_TRUE(at::equal(slices[2], wide.narrow(1, 4, 2)));
  EXPECT_TRUE(at::equal(AssembleTpMatrix(slices, fc2, {3, 8}), wide));
}

TEST(TpMuonTest, LocalFusedSplits) {
  // QKV: 4 KV groups over 2 ranks -> 2 whole groups each.
  ASSERT_OK_AND_ASSIGN(FusedSplit qkv, TpLocalFusedSplit({4, {8, 4, 4}}, {0, 1, 2, 1}, "qkv"));
  EXPECT_EQ(qkv.num_groups, 2);
  EXPECT_EQ(qkv.block_rows, (std::vector<int64_t>{8, 4, 4}));
  // fc1: gate and up halves, each cut by the tp size.
  ASSERT_OK_AND_ASSIGN(FusedSplit fc1, TpLocalFusedSplit({1, {24, 24}}, {0, 2, 2, 0}, "fc1"));
  EXPECT_EQ(fc1.num_groups, 1);
  EXPECT_EQ(fc1.block_rows, (std::vector<int64_t>{12, 12}));
  // Split along dim 1: the rows, hence the blocks, are whole.
  ASSERT_OK_AND_ASSIGN(FusedSplit cols, TpLocalFusedSplit({2, {3, 1}}, {1, 1, 2, 1}, "w"));
  EXPECT_EQ(cols.num_groups, 2);
  // Slices that hold no whole blocks.
  EXPECT_THAT(TpLocalFusedSplit({3, {8, 4, 4}}, {0, 1, 2, 0}, "qkv").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("param 'qkv'")));
  EXPECT_THAT(TpLocalFusedSplit({1, {24, 20}}, {0, 2, 2, 0}, "fc1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("param 'fc1'")));
}

TEST(TpMuonTest, NsCostPerLogicalBlock) {
  // max(m, n) min(m, n)^2 per block: QKV [2 * 16, 8] as Q [16, 8] and K, V [8, 8] each.
  EXPECT_DOUBLE_EQ(NsCost(32, 8, {2, {8, 4, 4}}), 16.0 * 64 + 2 * 512.0);
  EXPECT_DOUBLE_EQ(NsCost(8, 32, {}), 32.0 * 64);
}

TEST(TpMuonTest, ApplyUsesTheGlobalBlocksLrScale) {
  // A QKV-like [8, 2] of one group {Q 4, K 2, V 2} rows along dim 0 over 2 ranks: rank 0 holds
  // Q's rows 0-3, rank 1 K's and V's rows 4-7. Each row is scaled by its global block's shape.
  MuonHyper hp;
  hp.weight_decay = 0.0;
  hp.scale_rule = MuonScaleRule::kOriginal;  // sqrt(max(1, rows / cols)): Q [4, 2] -> sqrt 2
  const TpSplit tp{0, 1, 2, 1};
  const at::Tensor param = at::zeros({4, 2}, at::kFloat);
  const at::Tensor ortho = at::ones_like(param);
  ApplyTpOrtho(param, ortho, hp, /*lr=*/1.0, tp, {8, 2}, FusedSplit{1, {4, 2, 2}});
  // K and V are [2, 2]: scale 1.
  EXPECT_TRUE(at::equal(param, at::full({4, 2}, -1.0f)));
  const at::Tensor q_rows = at::zeros({4, 2}, at::kFloat);
  ApplyTpOrtho(q_rows, ortho, hp, 1.0, tp.ForRank(0), {8, 2}, FusedSplit{1, {4, 2, 2}});
  EXPECT_FLOAT_EQ(q_rows[0][0].item<float>(), -static_cast<float>(std::sqrt(2.0)));
}

TEST(TpMuonTest, BlockwiseIsMuonOnTheSlice) {
  at::set_num_threads(1);
  // fc1-like slice [12, 8] of a global [24, 8] = [gate 12; up 12], rank 0 of 2.
  const TpSplit tp{0, 2, 2, 0};
  const at::Tensor grad = Values({12, 8}, 0.3);
  MuonHyper hp;
  hp.lr = 0.02;
  at::Tensor split_param = Values({12, 8}, 0.5);
  at::Tensor plain_param = split_param.clone();
  Slot slot = Slot::Whole("fc1", split_param, grad);
  slot.tp = tp;
  ASSERT_OK_AND_ASSIGN(auto blockwise, Muon::Create({{std::move(slot), hp, {1, {12, 12}}}}));
  ASSERT_OK_AND_ASSIGN(auto plain,
                       Muon::Create({{Slot::Whole("fc1", plain_param, grad), hp, {1, {6, 6}}}}));
  for (int step = 0; step < 2; ++step) {
    ASSERT_OK(blockwise->Step({}));
    ASSERT_OK(plain->Step({}));
  }
  EXPECT_TRUE(at::equal(split_param, plain_param));
  // The global split is checked against the global rows.
  Slot bad = Slot::Whole("fc1", at::zeros({12, 8}), at::zeros({12, 8}));
  bad.tp = tp;
  EXPECT_THAT(Muon::Create({{std::move(bad), hp, {1, {12, 10}}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fc1")));
}

}  // namespace
}  // namespace orthoshard::optimizers
