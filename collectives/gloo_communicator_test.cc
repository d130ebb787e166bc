// In-process checks of the Gloo communicator: creation errors and launch validation at one rank.
// Multi-rank behaviour is in gloo_conformance_test (real processes).
#include "collectives/gloo_communicator.h"

#include <ATen/ops/zeros.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

GlooOptions SingleRank() {
  GlooOptions options;
  options.rank = 0;
  options.size = 1;
  options.master_port = 0;  // the hosted store picks a free port
  options.host_store = true;
  options.timeout = absl::Seconds(10);
  return options;
}

TEST(GlooCommunicatorTest, RejectsBadOptions) {
  GlooOptions options = SingleRank();
  options.rank = 1;
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 must be in [0, size) with size 1")));
  options = SingleRank();
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeouts must be positive")));
  options = SingleRank();
  options.host_store = false;
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("master_port 0 is not a usable port")));
}

TEST(GlooCommunicatorTest, PeerThatNeverArrivesFailsTheRendezvousInTime) {
  GlooOptions options = SingleRank();
  options.size = 2;
  options.rendezvous_timeout = absl::Seconds(1);
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("gloo rendezvous of rank 0 of 2 failed")));
}

TEST(GlooCommunicatorTest, SingleRankCollectivesAndLaunchValidation) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm, CreateGlooCommunicator(SingleRank()));
  EXPECT_EQ(comm->backend_name(), "gloo");
  EXPECT_EQ(comm->device(), at::Device(at::kCPU));
  at::Tensor t = at::zeros({4}, at::kFloat).add_(3);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, comm->AllReduce(t, {ReduceOp::kAvg}));
  EXPECT_OK(work->Wait(absl::Seconds(10)));
  EXPECT_OK(work->Wait(absl::Seconds(10)));  // waiting again is fine
  EXPECT_EQ(t.sum().item<float>(), 12.0f);

  at::Tensor matrix = at::zeros({4, 4}, at::kFloat);
  EXPECT_THAT(comm->AllReduce(matrix.t()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("op 0 (all_reduce) tensor must be contiguous")));
  EXPECT_THAT(comm->AllGather(at::zeros({4}, at::kFloat), at::zeros({4}, at::kBFloat16)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("output dtype BFloat16 differs from input dtype Float")));
  EXPECT_THAT(comm->ReduceScatter(at::zeros({4}, at::kFloat), at::zeros({3}, at::kFloat)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("output has 3 elements, rank 0's shard has 4")));
  EXPECT_THAT(comm->Broadcast(t, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 1 is outside [0, 1)")));
  EXPECT_THAT(comm->AllReduce(at::Tensor()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("all_reduce"), HasSubstr("is undefined"))));
  EXPECT_EQ(comm->traffic().Calls(OpKind::kAllReduce), 1);
  EXPECT_EQ(comm->traffic().Bytes(OpKind::kAllReduce), 16);

  // AllRanksOk: one float all-reduce each.
  ASSERT_OK_AND_ASSIGN(const bool all_ok, AllRanksOk(*comm, true));
  EXPECT_TRUE(all_ok);
  ASSERT_OK_AND_ASSIGN(const bool one_failed, AllRanksOk(*comm, false));
  EXPECT_FALSE(one_failed);
  EXPECT_EQ(comm->traffic().Calls(OpKind::kAllReduce), 3);
}

}  // namespace
}  // namespace orthoshard::collectives
