#include "common/tp_split.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace orthoshard {
namespace {

using Runs = std::vector<std::pair<int64_t, int64_t>>;

TEST(TpSplitTest, ReplicatedIsOneWholeRun) {
  const TpSplit replicated{.dim = -1, .parts = 1, .size = 4, .rank = 2};
  EXPECT_FALSE(replicated.split());
  EXPECT_EQ(TpRuns(12, replicated), (Runs{{0, 12}}));
  EXPECT_EQ(TpLocalShape({12, 8}, replicated), (std::vector<int64_t>{12, 8}));
  EXPECT_TRUE(ValidateTpSplit({12, 8}, replicated, "norm").ok());
}

TEST(TpSplitTest, RowsOfOnePartAreContiguous) {
  // QKV of 4 KV groups of 3 rows at tp 2: rank 1 holds groups 2 and 3, rows [6, 12).
  const TpSplit qkv{.dim = 0, .parts = 1, .size = 2, .rank = 1};
  EXPECT_EQ(TpRuns(12, qkv), (Runs{{6, 12}}));
  EXPECT_EQ(TpLocalShape({12, 8}, qkv), (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(TpGlobalShape({6, 8}, qkv), (std::vector<int64_t>{12, 8}));
}

TEST(TpSplitTest, TwoPartsInterleaveGateAndUp) {
  // fc1 [2F, C] with F = 8 at tp 4: rank 1 holds gate rows [2, 4) then up rows [10, 12).
  const TpSplit fc1{.dim = 0, .parts = 2, .size = 4, .rank = 1};
  EXPECT_EQ(TpRuns(16, fc1), (Runs{{2, 4}, {10, 12}}));
  // Every global row is held exactly once over the tp group.
  std::vector<int> held(16, 0);
  for (int r = 0; r < 4; ++r) {
    for (auto [b, e] : TpRuns(16, fc1.ForRank(r))) {
      for (int64_t i = b; i < e; ++i) ++held[i];
    }
  }
  for (int count : held) EXPECT_EQ(count, 1);
}

TEST(TpSplitTest, ColumnsSplitAlongDimOne) {
  const TpSplit proj{.dim = 1, .parts = 1, .size = 2, .rank = 0};
  EXPECT_EQ(TpLocalShape({8, 12}, proj), (std::vector<int64_t>{8, 6}));
  EXPECT_EQ(TpRuns(12, proj), (Runs{{0, 6}}));
  EXPECT_EQ(proj.ToString(), "dim 1, 1 part, rank 0 of 2");
}

TEST(TpSplitTest, ValidationNamesTheParamAndTheRule) {
  const absl::Status uneven =
      ValidateTpSplit({10, 8}, {.dim = 0, .parts = 2, .size = 4, .rank = 0}, "layers.0.mlp.fc1");
  EXPECT_EQ(uneven.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(uneven.message().find("layers.0.mlp.fc1"), absl::string_view::npos) << uneven;
  EXPECT_NE(uneven.message().find("(10) does not split into 2 part(s) x tp 4"),
            absl::string_view::npos)
      << uneven;
  EXPECT_FALSE(ValidateTpSplit({8}, {.dim = 1, .parts = 1, .size = 2, .rank = 0}, "w").ok());
  EXPECT_FALSE(ValidateTpSplit({8, 8}, {.dim = 0, .parts = 0, .size = 2, .rank = 0}, "w").ok());
  EXPECT_FALSE(ValidateTpSplit({8, 8}, {.dim = 0, .parts = 1, .size = 2, .rank = 2}, "w").ok());
}

}  // namespace
}  // namespace orthoshard
