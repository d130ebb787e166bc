// In-process tests of the sharded optimizers' ownership and model-space state, without a
// communicator: every rank's optimizer is built in one process over the same buffers.
#include <string>
#include <vector>

#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::optimizers::distributed {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ShardedStateTest, ZeroOneSlicesPartitionEveryParamAndReassemble) {
  const std::vector<layout::ParamSpec> specs = testing::SmallModel(2);
  constexpr int kDp = 3;
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model,
                       testing::BuildDistributedModel(specs, kDp, layout::Strategy::kDistOpt, 300));
  std::vector<DistOptParam> params;
  int64_t total = 0;
  for (auto* b : model.buffers) {
    for (int i = 0; i < static_cast<int>(b->layout().params.size()); ++i) {
      params.push_back({{b, i}, AdamWHyper{}});
      total += b->layout().params[i].numel();
    }
  }
  testing::FillRankGrads(specs, model, /*rank=*/0, /*step=*/0);
  std::vector<ShardedTensor> pieces;
  int64_t owned = 0;
  bool straddles = false;
  for (int r = 0; r < kDp; ++r) {
    ASSERT_OK_AND_ASSIGN(auto opt, DistributedOptimizer::Create(params, r, kDp));
    ASSERT_OK(opt->Step({1.0, 1.0}));
    owned += opt->owned_numel();
    for (ShardedTensor& t : opt->ExportState()) {
      if (t.offset > 0) straddles = true;
      pieces.push_back(std::move(t));
    }
  }
  EXPECT_EQ(owned, total);  // every element stepped by exactly one rank, no padding
  EXPECT_TRUE(straddles) << "no param straddles a shard; the test would prove nothing";
  ASSERT_OK_AND_ASSIGN(std::vector<NamedTensor> whole, AssembleModelSpace(pieces));
  for (const NamedTensor& t : whole) {
    if (t.name == "embedding.weight/exp_avg") {
      // After one step from zero, exp_avg = (1 - beta1) g, bitwise: lerp_(g, 1 - 0.9) from 0 is
      // fma(w, g - 0, 0) = round(w * g), and w = float(1 - 0.9) is float(0.1), mul's scalar.
      EXPECT_TRUE(at::equal(t.tensor, testing::RankGrad(specs[0], 0, 0, 0).mul(0.1)));
    }
  }
  // Re-import at dp 2 picks the slices each rank now owns.
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model2,
                       testing::BuildDistributedModel(specs, 2, layout::Strategy::kDistOpt, 300));
  std::vector<DistOptParam> params2;
  for (auto* b : model2.buffers) {
    for (int i = 0; i < static_cast<int>(b->layout().params.size()); ++i) {
      params2.push_back({{b, i}, AdamWHyper{}});
    }
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK_AND_ASSIGN(auto opt, DistributedOptimizer::Create(params2, r, 2));
    EXPECT_OK(opt->ImportState(pieces));
  }
}

TEST(ShardedStateTest, MuonParamStraddlingAShardIsRejected) {
  const std::vector<layout::ParamSpec> specs = testing::SmallModel(2);
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model,
                       testing::BuildDistributedModel(specs, 3, layout::Strategy::kDistOpt, 300));
  std::vector<LayerWiseParam> params;
  for (auto* b : model.buffers) {
    for (int i = 0; i < static_cast<int>(b->layout().params.size()); ++i) {
      if (b->layout().OwnerOf(b->layout().params[i]) < 0 && b->Param(i).dim() == 2) {
        params.push_back({{b, i}, MuonHyper{}, {}});
      }
    }
  }
  ASSERT_FALSE(params.empty());
  EXPECT_THAT(LayerWiseDistributedOptimizer::Create(params, 0, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("straddles a shard boundary of a distopt buffer")));
}

TEST(ShardedStateTest, DpMismatchIsRejected) {
  const std::vector<layout::ParamSpec> specs = testing::SmallModel(1);
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model,
                       testing::BuildDistributedModel(specs, 2, layout::Strategy::kLayerwise, 300));
  EXPECT_THAT(DistributedOptimizer::Create({{{model.buffers[0], 0}, AdamWHyper{}}}, 0, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is sharded over dp 2, the communicator has 4 ranks")));
}

TEST(ShardedStateTest, AssembleReportsGapsAndMismatches) {
  std::vector<ShardedTensor> pieces = {
      {"w/exp_avg", {2, 4}, 0, at::zeros({5}, at::kFloat)},
      {"w/exp_avg", {2, 4}, 5, at::zeros({3}, at::kFloat)},
  };
  EXPECT_OK(AssembleModelSpace(pieces).status());
  pieces[1].offset = 4;
  EXPECT_THAT(AssembleModelSpace(pieces).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("state tensor 'w/exp_avg' covers 7 of 8 elements")));
  pieces[1].offset = 6;
  EXPECT_THAT(AssembleModelSpace(pieces).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("piece [6, 9) outside 8")));
  pieces[1].offset = 5;
  pieces[1].full_shape = {8};
  EXPECT_THAT(AssembleModelSpace(pieces).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected shape [2,4], received [8]")));
}

}  // namespace
}  // namespace orthoshard::optimizers::distributed
