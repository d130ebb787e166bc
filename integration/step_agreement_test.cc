// StepAgreement on 3 real Gloo ranks: the step's one all-reduce gives every rank the mean loss, the
// stop signal, whether every save part is written, and the least and most communication wait of
// any rank (each rank's wait since its previous Set, from a running total).
#include "integration/step_agreement.h"

#include <ATen/ops/zeros.h>

#include "collectives/communicator.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using collectives::AllReduceOp;
using collectives::Communicator;
using collectives::ReduceOp;
using collectives::testing::RunOnRanks;

absl::Status AllReduceMean(Communicator& comm, const at::Tensor& t) {
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work,
                   comm.LaunchGroup({AllReduceOp{t, {ReduceOp::kAvg}}}));
  return work->Wait(comm.timeout());
}

// Values are sums of powers of two over at most 3 ranks: the AVG (a sum, then / 3) and the
// * world that undoes it round by at most a few ulps, far below the 1e-12 asked for.
constexpr double kTolerance = 1e-12;

TEST(StepAgreementTest, AgreesOnLossSignalSaveAndCommunicationWaits) {
  RunOnRanks(3, [](Communicator& comm) {
    StepAgreement agreement(comm);
    const int r = comm.rank();
    // Step 1: running totals 0.5, 0.25, 1.0 s; rank 1 asked to stop by signal 15; all written.
    const double totals1[] = {0.5, 0.25, 1.0};
    agreement.Set(1.0 + r, r == 1 ? 15 : 0, true, totals1[r]);
    ASSERT_OK(AllReduceMean(comm, agreement.tensor()));
    StepAgreement::Agreed a = agreement.Read();
    EXPECT_NEAR(a.loss, 2.0, kTolerance);
    EXPECT_EQ(a.stop_signal, 15);
    EXPECT_TRUE(a.save_written_everywhere);
    EXPECT_NEAR(a.min_comm_wait_s, 0.25, kTolerance);
    EXPECT_NEAR(a.max_comm_wait_s, 1.0, kTolerance);

    // Step 2: the totals grew by 0.125, 0.5, 0.0625 s (the last-but-one agreement's other-rank
    // slots must not leak into this one); nobody stops; rank 2's save is not written.
    const double totals2[] = {0.625, 0.75, 1.0625};
    agreement.Set(4.0, 0, r != 2, totals2[r]);
    ASSERT_OK(AllReduceMean(comm, agreement.tensor()));
    a = agreement.Read();
    EXPECT_NEAR(a.loss, 4.0, kTolerance);
    EXPECT_EQ(a.stop_signal, 0);
    EXPECT_FALSE(a.save_written_everywhere);
    EXPECT_NEAR(a.min_comm_wait_s, 0.0625, kTolerance);
    EXPECT_NEAR(a.max_comm_wait_s, 0.5, kTolerance);
  });
}

TEST(StepAgreementTest, OneRankAgreesWithItself) {
  RunOnRanks(1, [](Communicator& comm) {
    StepAgreement agreement(comm);
    agreement.Set(3.0, 2, false, 0.75);
    ASSERT_OK(AllReduceMean(comm, agreement.tensor()));
    const StepAgreement::Agreed a = agreement.Read();
    EXPECT_NEAR(a.loss, 3.0, kTolerance);
    EXPECT_EQ(a.stop_signal, 2);
    EXPECT_FALSE(a.save_written_everywhere);
    EXPECT_NEAR(a.min_comm_wait_s, 0.75, kTolerance);
    EXPECT_NEAR(a.max_comm_wait_s, 0.75, kTolerance);  // no skew with one rank
  });
}

}  // namespace
}  // namespace orthoshard::integration
