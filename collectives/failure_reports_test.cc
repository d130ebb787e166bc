// GroupState (internal/failure_reports.h) over an in-process store: which failure reports make a
// waiting peer give up, and the first failure a communicator keeps for its later refusals.
#include "collectives/internal/failure_reports.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives::internal_collectives {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FailureReportsTest, APeerThatGaveUpOnThisCollectiveOrAnEarlierOneIsNamed) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  GroupState rank0(store, 0, 3, {}, absl::Seconds(5));
  GroupState rank1(store, 1, 3, {}, absl::Seconds(5));
  EXPECT_EQ(rank1.PeerGaveUp(4), "");
  // A failure that is not a giving up (a wait shorter than the timeout that ran out) is reported
  // for the diagnosis only.
  rank0.Diagnose(4, absl::ZeroDuration(), /*gave_up=*/false);
  EXPECT_EQ(rank1.PeerGaveUp(4), "");
  rank0.Diagnose(4, absl::ZeroDuration(), /*gave_up=*/true);
  EXPECT_EQ(rank1.PeerGaveUp(3), "");  // rank 0 finished #3: it may still complete here
  EXPECT_EQ(rank1.PeerGaveUp(4), "rank 0 (gave up on #4)");
  EXPECT_EQ(rank1.PeerGaveUp(9), "rank 0 (gave up on #4)");
  EXPECT_EQ(rank0.PeerGaveUp(9), "");  // its own report is not a peer's
}

TEST(FailureReportsTest, ASubgroupNamesThePeerByGroupAndGlobalRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const GroupNaming naming{"tp group 1 [2, 3]", {2, 3}};
  GroupState rank0(store, 0, 2, naming, absl::Seconds(5));
  GroupState rank1(store, 1, 2, naming, absl::Seconds(5));
  const std::string blame = rank1.Diagnose(7, absl::ZeroDuration(), /*gave_up=*/true);
  EXPECT_THAT(blame, HasSubstr("rank 0 (global 2) reported no failure within 0"));
  EXPECT_EQ(rank0.PeerGaveUp(7), "rank 1 (global 3, gave up on #7)");
}

TEST(FailureReportsTest, TheFirstFailureIsKeptWithoutTheGroupsPrefix) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  GroupState group(store, 0, 2, {"dp group 0 [0, 2]", {0, 2}}, absl::Seconds(5));
  EXPECT_FALSE(group.failed());
  EXPECT_OK(group.FirstFailure());
  group.RecordFailure(absl::UnavailableError(
      "dp group 0 [0, 2]: all_reduce #3 failed on rank 0 (global 0): lost; rank 1 (global 2) "
      "reported no failure within 3s (lost?)"));
  group.RecordFailure(absl::InvalidArgumentError("all_reduce #4: gloo refused the launch"));
  EXPECT_TRUE(group.failed());
  EXPECT_THAT(group.FirstFailure(),
              StatusIs(absl::StatusCode::kUnavailable,
                       "all_reduce #3 failed on rank 0 (global 0): lost; rank 1 (global 2) "
                       "reported no failure within 3s (lost?)"));
}

}  // namespace
}  // namespace orthoshard::collectives::internal_collectives
