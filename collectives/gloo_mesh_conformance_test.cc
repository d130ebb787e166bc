// Runs the Communicator conformance suite on mesh groups (mesh.h) of Gloo ranks: 4 real processes
// (testing/multi_rank.h) as a tp 2 x dp 2 grid, the suite on the dp groups and on the tp groups
// (two groups of each at once, each its own communicator), and the arithmetic on a group of one
// rank (cp). In the failure cases "the last rank" is each group's last; their errors name ranks
// by their rank in the group and the world rank: "rank 1 (global 3, last launched #1)". The
// all-to-all case runs on the expert-parallel groups of dp 4 x ep 2, as mixture-of-experts token
// dispatch does: two groups {0, 1} and {2, 3} at once, neither the world nor a dp group.
#include <ATen/Parallel.h>

#include <string>

#include "absl/time/time.h"
#include "collectives/mesh.h"
#include "collectives/testing/conformance.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using testing::RunConformanceCase;

constexpr int kWorld = 4;

MeshGrid TwoByTwo() {
  MeshGrid grid;
  grid.tp = 2;
  grid.dp = 2;
  return grid;
}

// Runs conformance case `name` on this rank's group of `role` of the 2 x 2 mesh.
void RunOnGroup(Communicator& world, MeshRole role, const std::string& name) {
  at::set_num_threads(1);  // four ranks share the cores
  ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create(world, TwoByTwo()));
  ASSERT_OK(RunConformanceCase(name, mesh.group(role)));
}

TEST(GlooMeshConformanceTest, ArithmeticOnDpTpAndSingleRankGroups) {
  testing::RunOnRanks(
      kWorld,
      [](Communicator& world) {
        at::set_num_threads(1);
        ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create(world, TwoByTwo()));
        ASSERT_OK(RunConformanceCase("arithmetic", mesh.dp()));
        ASSERT_OK(RunConformanceCase("arithmetic", mesh.tp()));
        ASSERT_OK(RunConformanceCase("arithmetic", mesh.cp()));
      },
      testing::WithTimeouts(absl::Seconds(30), absl::Seconds(120)));
}

TEST(GlooMeshConformanceTest, AllToAllOnEpGroups) {
  testing::RunOnRanks(
      kWorld,
      [](Communicator& world) {
        at::set_num_threads(1);
        MeshGrid grid;
        grid.dp = kWorld;
        grid.ep = 2;
        ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create(world, grid));
        ASSERT_EQ(mesh.ep().size(), 2);
        ASSERT_NE(&mesh.ep(), &world);
        ASSERT_OK(RunConformanceCase("all_to_all", mesh.ep()));
      },
      testing::WithTimeouts(absl::Seconds(30), absl::Seconds(120)));
}

TEST(GlooMeshConformanceTest, RankSleepsPastTimeoutInTpGroups) {
  testing::RunOnRanks(
      kWorld, [](Communicator& world) { RunOnGroup(world, MeshRole::kTp, "sleep_past_timeout"); },
      testing::WithTimeouts(absl::Seconds(2), absl::Seconds(90)));
}

TEST(GlooMeshConformanceTest, RankKilledInDpGroups) {
  const testing::MultiRankOutcome outcome = testing::LaunchOnRanks(
      kWorld, [](Communicator& world) { RunOnGroup(world, MeshRole::kDp, "killed_rank"); },
      testing::WithTimeouts(absl::Seconds(2), absl::Seconds(90)));
  if (testing::InRankProcess()) return;
  // The last rank of each dp group ({0, 2}, {1, 3}), world ranks 2 and 3, SIGKILLs itself; ranks 0
  // and 1 must see the contract's errors in their dp groups and pass.
  EXPECT_EQ(outcome.launch.exit_code, 128 + 9) << outcome.Transcript();
  EXPECT_GE(outcome.launch.first_failed_rank, 2) << outcome.Transcript();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(outcome.passed[r]) << "rank " << r << ":\n" << outcome.Transcript();
  }
}

}  // namespace
}  // namespace orthoshard::collectives
