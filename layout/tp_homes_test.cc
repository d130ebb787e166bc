#include "layout/tp_homes.h"

#include <vector>

#include "gtest/gtest.h"

namespace orthoshard::layout {
namespace {

TEST(TpHomesTest, LongestFirstToTheLeastLoadedRank) {
  // 5, 4, 3, 3, 1 over 2 ranks: 5 -> 0, 4 -> 1, 3 -> 1 (4 < 5), 3 -> 0 (5 < 7), 1 -> 1 (7 < 8).
  const std::vector<double> costs = {3, 5, 1, 4, 3};
  const std::vector<int> homes = AssignTpHomes(costs, 2);
  EXPECT_EQ(homes, (std::vector<int>{1, 0, 1, 1, 0}));
  EXPECT_EQ(TpHomeLoads(costs, homes, 2), (std::vector<double>{8, 8}));
}

TEST(TpHomesTest, EqualCostsGoRoundTheGroupInIndexOrder) {
  const std::vector<int> homes = AssignTpHomes({2, 2, 2, 2, 2, 2}, 4);
  EXPECT_EQ(homes, (std::vector<int>{0, 1, 2, 3, 0, 1}));
}

TEST(TpHomesTest, OneRankHomesEverything) {
  EXPECT_EQ(AssignTpHomes({1, 7, 3}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(AssignTpHomes({}, 4).empty());
}

}  // namespace
}  // namespace orthoshard::layout
