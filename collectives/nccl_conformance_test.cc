// Runs the Communicator conformance suite on the NCCL backend on CUDA tensors, one process per
// GPU (the multi-rank harness, testing/multi_rank.h, with an NCCL join): 1 rank always; 2, 3 and 4
// ranks when the machine has that many GPUs (skipped otherwise). Then on mesh groups (mesh.h),
// each a ProcessGroupNCCL of its own: 1 rank with a communicator per role (groups of one rank
// created over the world's store); 4 ranks as tp 2 x dp 2, the suite on the dp and tp groups.
//
// Tagged manual and requires-gpu; on a GPU machine:
//   bazel test --config=cuda //collectives:nccl_conformance_test
// It compiles and links under --config=cuda; no GPU has been lent to run it yet. The failure cases
// depend on c10d's NCCL watchdog: with the default TORCH_NCCL_ASYNC_ERROR_HANDLING it may abort a
// surviving process on a timed-out collective instead of letting Wait return kUnavailable; if so,
// record it (and try TORCH_NCCL_ASYNC_ERROR_HANDLING=0) before changing the contract.
#include <memory>
#include <string>

#ifdef ORTHOSHARD_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/mesh.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "collectives/testing/conformance.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using testing::MultiRankOptions;
using testing::RunConformanceCase;

#ifdef ORTHOSHARD_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

int GpuCount() {
#ifdef ORTHOSHARD_CUDA
  return c10::cuda::device_count();
#else
  return 0;
#endif
}

// Ranks join NCCL on GPU LOCAL_RANK, with `timeout` on every collective.
MultiRankOptions Nccl(absl::Duration timeout) {
  MultiRankOptions options;
  options.collective_timeout = timeout;
  options.launch_timeout = absl::Seconds(60);
  options.join = [](absl::Duration t) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    ASSIGN_OR_RETURN(RendezvousInfo info, ParseRendezvous(ProcessEnvironment()));
    NcclOptions nccl = NcclOptionsFromRendezvous(info);
    nccl.timeout = t;
    nccl.rendezvous_timeout = absl::Seconds(30);
    return CreateNcclCommunicator(nccl);
  };
  return options;
}

class NcclConformanceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
#ifndef ORTHOSHARD_CUDA
    GTEST_SKIP() << "built without --config=cuda";
#endif
    if (GpuCount() < GetParam()) {
      GTEST_SKIP() << GetParam() << " ranks need " << GetParam() << " GPUs, found " << GpuCount();
    }
  }
};

TEST_P(NcclConformanceTest, Arithmetic) {
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) { ASSERT_OK(RunConformanceCase("arithmetic", comm, comm.device())); },
      Nccl(absl::Seconds(20)));
}

TEST_P(NcclConformanceTest, AllToAll) {
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) { ASSERT_OK(RunConformanceCase("all_to_all", comm, comm.device())); },
      Nccl(absl::Seconds(20)));
}

TEST_P(NcclConformanceTest, AllToAllNotLaunchedByAPeer) {
  if (GetParam() < 2) GTEST_SKIP() << "needs a surviving rank";
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) {
        ASSERT_OK(RunConformanceCase("all_to_all_not_launched", comm, comm.device()));
      },
      Nccl(absl::Seconds(2)));
}

TEST_P(NcclConformanceTest, RankSleepsPastTimeout) {
  if (GetParam() < 2) GTEST_SKIP() << "needs a surviving rank";
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) {
        ASSERT_OK(RunConformanceCase("sleep_past_timeout", comm, comm.device()));
      },
      Nccl(absl::Seconds(2)));
}

TEST_P(NcclConformanceTest, RankKilled) {
  const int world = GetParam();
  if (world < 2) GTEST_SKIP() << "needs a surviving rank";
  const testing::MultiRankOutcome outcome = testing::LaunchOnRanks(
      world,
      [](Communicator& comm) { ASSERT_OK(RunConformanceCase("killed_rank", comm, comm.device())); },
      Nccl(absl::Seconds(2)));
  if (testing::InRankProcess()) return;
  EXPECT_EQ(outcome.launch.exit_code, 128 + 9) << outcome.Transcript();
  EXPECT_EQ(outcome.launch.first_failed_rank, world - 1);
  for (int r = 0; r + 1 < world; ++r) {
    EXPECT_TRUE(outcome.passed[r]) << "rank " << r << ":\n" << outcome.Transcript();
  }
}

// Why `ranks` ranks cannot run here (one GPU each), or "" when they can.
std::string NoGpusFor(int ranks) {
  if (GpuCount() >= ranks) return "";
  return absl::StrCat(ranks, " ranks need ", ranks, " GPUs (built ",
                      kBuiltWithCuda ? "with" : "without", " --config=cuda), found ", GpuCount());
}

MeshGrid TwoByTwo() {
  MeshGrid grid;
  grid.tp = 2;
  grid.dp = 2;
  return grid;
}

// Conformance case `name` on this rank's group of `role` of a mesh over the NCCL world.
void RunOnGroup(Communicator& world, const MeshGrid& grid, const MeshOptions& options,
                MeshRole role, const std::string& name) {
  ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create(world, grid, options));
  ASSERT_OK(RunConformanceCase(name, mesh.group(role), mesh.group(role).device()));
}

TEST(NcclMeshConformanceTest, ArithmeticOnOwnGroupsOfOneRank) {
  if (const std::string why = NoGpusFor(1); !why.empty()) GTEST_SKIP() << why;
  testing::RunOnRanks(
      1,
      [](Communicator& world) {
        MeshOptions own;
        own.share_equal_groups = false;  // dp and tp: NCCL communicators of their own
        ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create(world, DataParallelGrid(1), own));
        ASSERT_NE(&mesh.dp(), &world);
        ASSERT_OK(RunConformanceCase("arithmetic", mesh.dp(), mesh.dp().device()));
        ASSERT_OK(RunConformanceCase("arithmetic", mesh.tp(), mesh.tp().device()));
      },
      Nccl(absl::Seconds(20)));
}

TEST(NcclMeshConformanceTest, ArithmeticOnDpAndTpGroups) {
  if (const std::string why = NoGpusFor(4); !why.empty()) GTEST_SKIP() << why;
  testing::RunOnRanks(
      4,
      [](Communicator& world) {
        RunOnGroup(world, TwoByTwo(), {}, MeshRole::kDp, "arithmetic");
        RunOnGroup(world, TwoByTwo(), {}, MeshRole::kTp, "arithmetic");
      },
      Nccl(absl::Seconds(20)));
}

TEST(NcclMeshConformanceTest, RankSleepsPastTimeoutInTpGroups) {
  if (const std::string why = NoGpusFor(4); !why.empty()) GTEST_SKIP() << why;
  testing::RunOnRanks(
      4,
      [](Communicator& world) {
        RunOnGroup(world, TwoByTwo(), {}, MeshRole::kTp, "sleep_past_timeout");
      },
      Nccl(absl::Seconds(2)));
}

TEST(NcclMeshConformanceTest, RankKilledInDpGroups) {
  if (const std::string why = NoGpusFor(4); !why.empty()) GTEST_SKIP() << why;
  const testing::MultiRankOutcome outcome = testing::LaunchOnRanks(
      4,
      [](Communicator& world) {
        RunOnGroup(world, TwoByTwo(), {}, MeshRole::kDp, "killed_rank");
      },
      Nccl(absl::Seconds(2)));
  if (testing::InRankProcess()) return;
  // World ranks 2 and 3, the last of the dp groups {0, 2} and {1, 3}, SIGKILL themselves.
  EXPECT_EQ(outcome.launch.exit_code, 128 + 9) << outcome.Transcript();
  EXPECT_GE(outcome.launch.first_failed_rank, 2) << outcome.Transcript();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(outcome.passed[r]) << "rank " << r << ":\n" << outcome.Transcript();
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclConformanceTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::collectives
