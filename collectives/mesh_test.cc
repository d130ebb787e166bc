// The mesh: grid validation, the rank -> coordinates mapping checked against a port of
// Megatron-LM's RankGenerator, and real Gloo ranks on loopback (testing/multi_rank.h): each rank's
// groups hold the expected members, collectives in one group never see another's traffic, groups of
// one rank work, and the 1-D grid uses the world communicator.
#include "collectives/mesh.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using ::orthoshard::testing::IsOk;
using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MeshGrid Grid(int tp, int cp, int dp, int pp, int ep) {
  MeshGrid grid;
  grid.tp = tp;
  grid.cp = cp;
  grid.dp = dp;
  grid.pp = pp;
  grid.ep = ep;
  return grid;
}

TEST(MeshGridTest, SizesMustBePositive) {
  EXPECT_THAT(ValidateGrid(Grid(0, 1, 4, 1, 1), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mesh grid: tp must be at least 1, got 0")));
  EXPECT_THAT(ValidateGrid(Grid(1, 1, 4, 1, -2), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mesh grid: ep must be at least 1, got -2")));
  EXPECT_THAT(ValidateGrid(Grid(1, 1, 4, 0, 1), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mesh grid: pp must be at least 1, got 0")));
}

TEST(MeshGridTest, ProductMustBeTheWorldSize) {
  EXPECT_THAT(ValidateGrid(Grid(2, 1, 3, 1, 1), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mesh grid: tp 2 x cp 1 x dp 3 x pp 1 = 6 ranks, but the world "
                                 "has 4 (dp 2 would fit)")));
  EXPECT_THAT(ValidateGrid(Grid(4, 1, 1, 1, 1), 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tp 4 x cp 1 x dp 1 x pp 1 = 4 ranks, but the world has 6")));
}

TEST(MeshGridTest, EpMustDivideCpTimesDp) {
  EXPECT_THAT(ValidateGrid(Grid(1, 2, 2, 1, 3), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mesh grid: ep 3 must divide cp x dp = 4")));
  EXPECT_THAT(ValidateGrid(Grid(2, 1, 2, 1, 2), 4), IsOk());
  EXPECT_THAT(ValidateGrid(DataParallelGrid(4), 4), IsOk());
}

TEST(MeshGridTest, TwoByTwoAsTheArchitectureDrawsIt) {
  const MeshGrid grid = Grid(2, 1, 2, 1, 1);
  // ranks (tp, dp): 0=(0,0) 1=(1,0) 2=(0,1) 3=(1,1)
  const int want[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
  for (int r = 0; r < 4; ++r) {
    const MeshCoordinates c = CoordinatesOf(grid, r);
    EXPECT_EQ(c.tp, want[r][0]) << r;
    EXPECT_EQ(c.dp, want[r][1]) << r;
    EXPECT_EQ(c.cp + c.pp + c.ep, 0) << r;
    EXPECT_EQ(c.expt_dp, c.dp) << r;
  }
  EXPECT_THAT(GroupRanks(grid, MeshRole::kTp, 3), ElementsAre(2, 3));
  EXPECT_THAT(GroupRanks(grid, MeshRole::kDp, 3), ElementsAre(1, 3));
  EXPECT_THAT(GroupRanks(grid, MeshRole::kExptDp, 0), ElementsAre(0, 2));
  EXPECT_THAT(GroupRanks(grid, MeshRole::kCp, 2), ElementsAre(2));
  EXPECT_EQ(GroupIndex(grid, MeshRole::kTp, 3), 1);
  EXPECT_EQ(GroupIndex(grid, MeshRole::kDp, 3), 1);
  EXPECT_EQ(GroupIndex(grid, MeshRole::kDp, 2), 0);
}

TEST(MeshGridTest, ExpertsSplitContextAndDataParallelRanks) {
  // world 8 = tp 2 x cp 2 x dp 2; ep 4 over the cp x dp = 4 ranks of each tp index, expt_dp 1.
  const MeshGrid grid = Grid(2, 2, 2, 1, 4);
  EXPECT_EQ(grid.expt_dp(), 1);
  const MeshCoordinates c = CoordinatesOf(grid, 7);  // tp 1, cp 1, dp 1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 1);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.ep, 3);
  EXPECT_EQ(c.expt_dp, 0);
  EXPECT_THAT(GroupRanks(grid, MeshRole::kEp, 7), ElementsAre(1, 3, 5, 7));
  EXPECT_THAT(GroupRanks(grid, MeshRole::kCp, 7), ElementsAre(5, 7));
  EXPECT_THAT(GroupRanks(grid, MeshRole::kDp, 7), ElementsAre(3, 7));
  EXPECT_THAT(GroupRanks(grid, MeshRole::kExptDp, 7), ElementsAre(7));
}

// Megatron-LM's generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py): the
// groups that vary the masked dimensions of `sizes` (innermost first), numbered by the others.
std::vector<std::vector<int>> MegatronGroups(const std::vector<int>& sizes,
                                             const std::vector<bool>& mask) {
  std::vector<int> masked, unmasked, masked_stride, unmasked_stride;
  int stride = 1, world = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    (mask[d] ? masked : unmasked).push_back(sizes[d]);
    (mask[d] ? masked_stride : unmasked_stride).push_back(stride);
    stride *= sizes[d];
    world *= sizes[d];
  }
  auto decompose_dot = [](int index, const std::vector<int>& shape,
                          const std::vector<int>& strides) {
    int value = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      value += (index % shape[i]) * strides[i];
      index /= shape[i];
    }
    return value;
  };
  int group_size = 1;
  for (int s : masked) group_size *= s;
  std::vector<std::vector<int>> groups(world / group_size);
  for (int g = 0; g < world / group_size; ++g) {
    for (int k = 0; k < group_size; ++k) {
      groups[g].push_back(decompose_dot(k, masked, masked_stride) +
                          decompose_dot(g, unmasked, unmasked_stride));
    }
  }
  return groups;
}

// Megatron's RankGenerator with order "tp-cp-ep-dp-pp": the dense generator (ep 1) for tp, cp, dp
// and pp; the expert one (tp, ep, expert dp, pp; cp 1) for ep and expt_dp.
std::vector<std::vector<int>> MegatronGroups(const MeshGrid& grid, MeshRole role) {
  const bool expert = role == MeshRole::kEp || role == MeshRole::kExptDp;
  const std::vector<int> sizes =
      expert ? std::vector<int>{grid.tp, 1, grid.ep, grid.expt_dp(), grid.pp}
             : std::vector<int>{grid.tp, grid.cp, 1, grid.dp, grid.pp};
  std::vector<bool> mask(5, false);
  switch (role) {
    case MeshRole::kTp: mask[0] = true; break;
    case MeshRole::kCp: mask[1] = true; break;
    case MeshRole::kEp: mask[2] = true; break;
    case MeshRole::kDp:
    case MeshRole::kExptDp: mask[3] = true; break;
    case MeshRole::kPp: mask[4] = true; break;
  }
  return MegatronGroups(sizes, mask);
}

TEST(MeshGridTest, GroupsAreMegatronsRankGeneratorGroups) {
  const MeshGrid grids[] = {Grid(2, 1, 2, 1, 1), Grid(2, 2, 2, 1, 1), Grid(2, 1, 2, 2, 1),
                            Grid(1, 1, 4, 1, 2), Grid(2, 2, 2, 1, 4), Grid(1, 3, 2, 1, 2),
                            Grid(1, 1, 8, 1, 8), Grid(2, 1, 3, 2, 3), Grid(4, 1, 1, 1, 1)};
  for (const MeshGrid& grid : grids) {
    ASSERT_THAT(ValidateGrid(grid, grid.world_size()), IsOk());
    for (MeshRole role : kMeshRoles) {
      const std::vector<std::vector<int>> groups = MegatronGroups(grid, role);
      ASSERT_EQ(static_cast<int>(groups.size()), grid.world_size() / grid.SizeOf(role));
      for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
        for (int k = 0; k < static_cast<int>(groups[g].size()); ++k) {
          const int rank = groups[g][k];
          const std::string where =
              absl::StrCat("tp ", grid.tp, " cp ", grid.cp, " dp ", grid.dp, " pp ", grid.pp,
                           " ep ", grid.ep, ", ", MeshRoleName(role), ", rank ", rank);
          EXPECT_EQ(GroupRanks(grid, role, rank), groups[g]) << where;
          EXPECT_EQ(GroupIndex(grid, role, rank), g) << where;
          EXPECT_EQ(CoordinatesOf(grid, rank).Of(role), k) << where;
        }
      }
    }
  }
}

// Rank processes: set-up shared by every body.
std::unique_ptr<Mesh> MustCreate(Communicator& world, const MeshGrid& grid,
                                 const MeshOptions& options = {}) {
  at::set_num_threads(1);  // four ranks share the cores
  absl::StatusOr<Mesh> mesh = Mesh::Create(world, grid, options);
  EXPECT_THAT(mesh, IsOk());
  return mesh.ok() ? std::make_unique<Mesh>(*std::move(mesh)) : nullptr;
}

// The world ranks of `group`'s members, by all-gather: each contributes its world rank.
std::vector<int> MembersByAllGather(Communicator& group, int world_rank) {
  at::Tensor mine = at::full({1}, static_cast<float>(world_rank));
  at::Tensor all = at::empty({group.size()}, at::kFloat);
  absl::StatusOr<std::unique_ptr<Work>> work = group.AllGather(mine, all);
  EXPECT_THAT(work, IsOk());
  if (!work.ok()) return {};
  EXPECT_THAT((*work)->Wait(group.timeout()), IsOk());
  std::vector<int> members;
  for (int i = 0; i < group.size(); ++i) members.push_back(static_cast<int>(all[i].item<float>()));
  return members;
}

constexpr absl::Duration kCollectiveTimeout = absl::Seconds(60);

TEST(MeshTest, TwoByTwoGroupsHoldTheirMembersAndOnlyTheirTraffic) {
  testing::RunOnRanks(4, [](Communicator& world) {
    EXPECT_THAT(Mesh::Create(world, Grid(2, 1, 3, 1, 1)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("but the world has 4")));
    const std::unique_ptr<Mesh> mesh = MustCreate(world, Grid(2, 1, 2, 1, 1));
    ASSERT_NE(mesh, nullptr);
    const int r = world.rank();
    EXPECT_EQ(mesh->coordinates().tp, r % 2);
    EXPECT_EQ(mesh->coordinates().dp, r / 2);
    EXPECT_THAT(mesh->group_ranks(MeshRole::kTp), ElementsAre(r / 2 * 2, r / 2 * 2 + 1));
    EXPECT_THAT(mesh->group_ranks(MeshRole::kDp), ElementsAre(r % 2, r % 2 + 2));
    EXPECT_EQ(mesh->tp().rank(), r % 2);
    EXPECT_EQ(mesh->dp().rank(), r / 2);
    EXPECT_EQ(mesh->cp().size(), 1);
    // Equal groups share: expt_dp is dp (ep 1, cp 1); cp, ep and pp are one group of this rank.
    EXPECT_EQ(&mesh->expt_dp(), &mesh->dp());
    EXPECT_EQ(&mesh->ep(), &mesh->cp());
    EXPECT_EQ(&mesh->pp(), &mesh->cp());
    EXPECT_NE(&mesh->dp(), &world);

    for (MeshRole role : {MeshRole::kTp, MeshRole::kDp, MeshRole::kCp}) {
      EXPECT_EQ(MembersByAllGather(mesh->group(role), r), mesh->group_ranks(role))
          << MeshRoleName(role);
    }

    // Both tp groups and both dp groups all-reduce at once, each with values of its own; every
    // rank has a tp and a dp all-reduce in flight together, waited for in either order.
    const TrafficCounters tp_before = mesh->tp().traffic(), dp_before = mesh->dp().traffic();
    constexpr int kRounds = 10;
    for (int round = 0; round < kRounds; ++round) {
      const float tp_value = static_cast<float>((r % 2 + 1) * (r / 2 == 0 ? 1 : 100) + round);
      const float dp_value = static_cast<float>((r + 1) * 1000);
      at::Tensor tp_tensor = at::full({1000}, tp_value);
      at::Tensor dp_tensor = at::full({37}, dp_value);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> tp_work, mesh->tp().AllReduce(tp_tensor));
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> dp_work, mesh->dp().AllReduce(dp_tensor));
      if (round % 2 == 0) {
        ASSERT_OK(dp_work->Wait(kCollectiveTimeout));
        ASSERT_OK(tp_work->Wait(kCollectiveTimeout));
      } else {
        ASSERT_OK(tp_work->Wait(kCollectiveTimeout));
        ASSERT_OK(dp_work->Wait(kCollectiveTimeout));
      }
      // tp group {0,1} sums 1 + 2, {2,3} sums 100 + 200; dp group {r%2, r%2+2} sums their ranks
      // + 1.
      const float tp_want = 3.0f * (r / 2 == 0 ? 1 : 100) + 2.0f * round;
      const float dp_want = 1000.0f * ((r % 2 + 1) + (r % 2 + 3));
      EXPECT_TRUE(tp_tensor.eq(tp_want).all().item<bool>()) << "round " << round;
      EXPECT_TRUE(dp_tensor.eq(dp_want).all().item<bool>()) << "round " << round;
    }
    // Counters are per group; the world launched nothing.
    const TrafficCounters tp_after = mesh->tp().traffic(), dp_after = mesh->dp().traffic();
    EXPECT_EQ(tp_after.Calls(OpKind::kAllReduce) - tp_before.Calls(OpKind::kAllReduce), kRounds);
    EXPECT_EQ(tp_after.Bytes(OpKind::kAllReduce) - tp_before.Bytes(OpKind::kAllReduce),
              kRounds * 4000);
    EXPECT_EQ(dp_after.Bytes(OpKind::kAllReduce) - dp_before.Bytes(OpKind::kAllReduce),
              kRounds * 37 * 4);
    EXPECT_EQ(world.traffic().Calls(OpKind::kAllReduce), 0);

    // A group of one rank: the collectives are copies of this rank's data.
    Communicator& single = mesh->cp();
    at::Tensor t = at::full({5}, 7.0f);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> avg, single.AllReduce(t, {ReduceOp::kAvg}));
    ASSERT_OK(avg->Wait(kCollectiveTimeout));
    EXPECT_TRUE(t.eq(7.0f).all().item<bool>());
    at::Tensor shard = at::empty({5}, at::kFloat);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> rs, single.ReduceScatter(t, shard));
    ASSERT_OK(rs->Wait(kCollectiveTimeout));
    EXPECT_TRUE(shard.eq(7.0f).all().item<bool>());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> barrier, single.Barrier());
    ASSERT_OK(barrier->Wait(kCollectiveTimeout));
  });
}

TEST(MeshTest, OneDimensionalGridUsesTheWorldAndMeshesStayApart) {
  testing::RunOnRanks(4, [](Communicator& world) {
    const int r = world.rank();
    // dp = world: today's data-parallel group is the world communicator itself.
    const std::unique_ptr<Mesh> shared = MustCreate(world, DataParallelGrid(4));
    ASSERT_NE(shared, nullptr);
    EXPECT_EQ(&shared->dp(), &world);
    EXPECT_EQ(&shared->expt_dp(), &world);
    EXPECT_EQ(shared->tp().size(), 1);
    EXPECT_EQ(&shared->pp(), &shared->tp());

    // Unshared, every role gets its own communicator, the dp one a copy of the world's group.
    MeshOptions own;
    own.share_equal_groups = false;
    const std::unique_ptr<Mesh> separate = MustCreate(world, DataParallelGrid(4), own);
    ASSERT_NE(separate, nullptr);
    EXPECT_NE(&separate->dp(), &world);
    EXPECT_NE(&separate->expt_dp(), &separate->dp());
    EXPECT_NE(&separate->pp(), &separate->tp());
    EXPECT_EQ(separate->dp().rank(), r);
    EXPECT_EQ(MembersByAllGather(separate->dp(), r), std::vector<int>({0, 1, 2, 3}));
    EXPECT_EQ(MembersByAllGather(separate->expt_dp(), r), std::vector<int>({0, 1, 2, 3}));
    EXPECT_EQ(separate->dp().traffic().Calls(OpKind::kAllGather), 1);
    EXPECT_EQ(world.traffic().Calls(OpKind::kAllGather), 0);

    // More meshes over the same world: their groups live under store prefixes of their own.
    const std::unique_ptr<Mesh> tp4 = MustCreate(world, Grid(4, 1, 1, 1, 1));
    const std::unique_ptr<Mesh> again = MustCreate(world, Grid(2, 1, 2, 1, 2));
    ASSERT_NE(tp4, nullptr);
    ASSERT_NE(again, nullptr);
    EXPECT_EQ(&tp4->tp(), &world);
    EXPECT_EQ(tp4->dp().size(), 1);
    // ep 2 over dp 2: the ep group is the dp group; expt_dp is this rank alone.
    EXPECT_EQ(&again->dp(), &again->ep());
    EXPECT_EQ(again->expt_dp().size(), 1);
    EXPECT_EQ(MembersByAllGather(again->tp(), r), again->group_ranks(MeshRole::kTp));
    EXPECT_EQ(MembersByAllGather(again->ep(), r), again->group_ranks(MeshRole::kEp));
  });
}

}  // namespace
}  // namespace orthoshard::collectives
