// In-process tests of the slots each rank updates (RankSlots) and of model-space state across
// ranks, without a communicator: every rank's slots are built in one process over the same
// buffers.
#include <string>
#include <vector>

#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/adamw.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::optimizers::distributed {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

// SmallModel with every param routed to AdamW (so the byte-level layout may split any of them).
std::vector<layout::ParamSpec> AllAdamW() {
  std::vector<layout::ParamSpec> specs = testing::SmallModel(2);
  for (layout::ParamSpec& s : specs) s.role = layout::ParamRole::kAdam;
  return specs;
}

TEST(ShardedStateTest, ZeroOneSlicesPartitionEveryParamAndReassemble) {
  const std::vector<layout::ParamSpec> specs = AllAdamW();
  constexpr int kDp = 3;
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model,
                       testing::BuildDistributedModel(specs, kDp, layout::Strategy::kDistOpt, 300));
  int64_t total = 0;
  for (const layout::ParamSpec& s : specs) total += s.numel();
  testing::FillRankGrads(specs, model, /*rank=*/0, /*step=*/0);
  std::vector<StateRecord> pieces;
  int64_t owned = 0;
  bool straddles = false;
  for (int r = 0; r < kDp; ++r) {
    ASSERT_OK_AND_ASSIGN(std::vector<Slot> slots,
                         RankSlots(model.buffers, r, DistributedMode::kSharded));
    std::vector<AdamW::Entry> entries;
    for (Slot& s : slots) entries.push_back({std::move(s), AdamWHyper{}});
    ASSERT_OK_AND_ASSIGN(auto opt, AdamW::Create(std::move(entries)));
    ASSERT_OK(opt->Step({1.0, 1.0}));
    owned += opt->numel();
    std::vector<StateRecord> records;
    opt->ExportState(records);
    for (StateRecord& t : records) {
      if (t.offset > 0) straddles = true;
      pieces.push_back(std::move(t));
    }
  }
  EXPECT_EQ(owned, total);  // every element stepped by exactly one rank, no padding
  EXPECT_TRUE(straddles) << "no param straddles a shard; the test would prove nothing";
  ASSERT_OK_AND_ASSIGN(std::vector<StateRecord> whole, AssembleModelSpace(pieces));
  bool checked = false;
  for (const StateRecord& t : whole) {
    if (t.name == "embedding.weight/exp_avg") {
      // After one step from zero, exp_avg = (1 - beta1) g, bitwise: lerp_(g, 1 - 0.9) from 0 is
      // fma(w, g - 0, 0) = round(w * g), and w = float(1 - 0.9) is float(0.1), mul's scalar.
      EXPECT_TRUE(at::equal(t.tensor, testing::RankGrad(specs[0], 0, 0, 0).mul(0.1)));
      checked = true;
    }
  }
  EXPECT_TRUE(checked);
  // Re-import at dp 2 picks the slices each rank now owns.
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model2,
                       testing::BuildDistributedModel(specs, 2, layout::Strategy::kDistOpt, 300));
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK_AND_ASSIGN(std::vector<Slot> slots,
                         RankSlots(model2.buffers, r, DistributedMode::kSharded));
    std::vector<AdamW::Entry> entries;
    for (Slot& s : slots) entries.push_back({std::move(s), AdamWHyper{}});
    ASSERT_OK_AND_ASSIGN(auto opt, AdamW::Create(std::move(entries)));
    EXPECT_OK(opt->ImportState(pieces));
  }
}

// Sharded: Muon matrices whole on exactly one rank, AdamW elements on exactly one. Replicated:
// every param whole on every rank, each element saved by exactly one rank.
TEST(ShardedStateTest, SlotsCoverEveryElementOnce) {
  const std::vector<layout::ParamSpec> specs = testing::SmallModel(2);
  constexpr int kDp = 3;
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model, testing::BuildDistributedModel(
                                                            specs, kDp,
                                                            layout::Strategy::kLayerwise, 300));
  int64_t total = 0;
  for (const layout::ParamSpec& s : specs) total += s.numel();
  int64_t stepped = 0, saved = 0, replicated_saved = 0;
  for (int r = 0; r < kDp; ++r) {
    ASSERT_OK_AND_ASSIGN(std::vector<Slot> sharded,
                         RankSlots(model.buffers, r, DistributedMode::kSharded));
    for (const Slot& s : sharded) {
      stepped += s.numel();
      saved += s.saved_end - s.saved_begin;
      if (s.full_shape.size() == 2 && s.name.find("norm") == std::string::npos &&
          s.name.find("embedding") == std::string::npos) {
        EXPECT_TRUE(s.covers_whole()) << s.name;  // a Muon matrix
      }
    }
    ASSERT_OK_AND_ASSIGN(std::vector<Slot> replicated,
                         RankSlots(model.buffers, r, DistributedMode::kReplicated));
    EXPECT_EQ(replicated.size(), specs.size());
    for (const Slot& s : replicated) {
      EXPECT_TRUE(s.covers_whole()) << s.name;
      replicated_saved += s.saved_end - s.saved_begin;
    }
  }
  EXPECT_EQ(stepped, total);
  EXPECT_EQ(saved, total);
  EXPECT_EQ(replicated_saved, total);
}

TEST(ShardedStateTest, MuonParamStraddlingAShardIsRejected) {
  const std::vector<layout::ParamSpec> specs = testing::SmallModel(2);
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model,
                       testing::BuildDistributedModel(specs, 3, layout::Strategy::kDistOpt, 300));
  EXPECT_THAT(RankSlots(model.buffers, 0, DistributedMode::kSharded).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is routed to muon but straddles a shard boundary of a distopt "
                                 "buffer")));
  // Replicated, every rank updates whole params: the same layout is fine.
  EXPECT_OK(RankSlots(model.buffers, 0, DistributedMode::kReplicated).status());
}

TEST(ShardedStateTest, RoutingIsTheLayoutsRoles) {
  const std::vector<layout::ParamSpec> specs = testing::SmallModel(1);
  ASSERT_OK_AND_ASSIGN(testing::DistributedModel model, testing::BuildDistributedModel(
                                                            specs, 2,
                                                            layout::Strategy::kLayerwise, 300));
  const RoutingReport report = LayoutRouting(model.buffers);
  ASSERT_EQ(report.entries.size(), specs.size());
  for (const layout::ParamSpec& s : specs) {
    bool found = false;
    for (const RoutingReport::Entry& e : report.entries) {
      if (e.name != s.name) continue;
      found = true;
      EXPECT_EQ(e.route == Route::kMuon, s.role == layout::ParamRole::kMuon) << s.name;
    }
    EXPECT_TRUE(found) << s.name;
  }
}

}  // namespace
}  // namespace orthoshard::optimizers::distributed
