// The Gloo communicator's reduce-scatter and all-gather, rings over c10d Gloo's send/recv
// (internal/ring.h), with 2, 3 and 4 real processes, beyond what the conformance suite covers:
// buffers large enough to be cut into many pieces (with uneven and empty shards), the exact wire
// bytes each rank sends, independence from engine collectives launched meanwhile, and a peer
// killed in the middle of a ring.
#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using testing::MultiRankOptions;

MultiRankOptions WithTimeout(absl::Duration timeout) {
  return testing::WithTimeouts(timeout, absl::Seconds(120));
}

// Shards of 3M + r·1M elements (12 MB and more: several 4 MiB pieces each), rank 1's empty.
std::vector<int64_t> ShardSizes(int size) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < size; ++r) sizes.push_back(r == 1 ? 0 : (3 + r) << 20);
  return sizes;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total;
}

// Rank r's input: (element index mod 1024) + r, small integers whose fp32 sums over 4 ranks are
// exact in any order, so the result must equal the reference bit for bit.
at::Tensor Input(int64_t n, int rank) {
  return at::arange(n, at::kLong).remainder(1024).add(rank).to(at::kFloat);
}

absl::Status LargeShardsAndWireBytes(Communicator& comm) {
  const int size = comm.size(), rank = comm.rank();
  const std::vector<int64_t> sizes = ShardSizes(size);
  const int64_t total = Sum(sizes);
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += sizes[r];
  at::Tensor input = Input(total, rank);
  at::Tensor want = at::zeros({total}, at::kFloat);
  for (int r = 0; r < size; ++r) want.add_(Input(total, r));
  const TrafficCounters before = comm.traffic();
  ReduceScatterOptions rs;
  rs.shard_sizes = sizes;
  ASSIGN_OR_RETURN(auto work, comm.ReduceScatter(input, input.narrow(0, offset, sizes[rank]), rs));
  RETURN_IF_ERROR(work->Wait(comm.timeout()));
  if (!at::equal(input.narrow(0, offset, sizes[rank]), want.narrow(0, offset, sizes[rank]))) {
    return absl::InternalError("reduce-scatter: this rank's shard differs from the exact sum");
  }
  // Every rank's reduced shard, gathered back (the input is the output's own slot).
  AllGatherOptions ag;
  ag.shard_sizes = sizes;
  at::Tensor gathered = at::zeros({total}, at::kFloat);
  gathered.narrow(0, offset, sizes[rank]).copy_(input.narrow(0, offset, sizes[rank]));
  ASSIGN_OR_RETURN(work,
                   comm.AllGather(gathered.narrow(0, offset, sizes[rank]), gathered, ag));
  RETURN_IF_ERROR(work->Wait(comm.timeout()));
  if (!at::equal(gathered, want)) return absl::InternalError("all-gather differs from the sums");
  // Wire bytes, counted as sent: every chunk but this rank's own (reduce-scatter) and but the
  // right neighbour's (all-gather, which it already has), 4 bytes each.
  const TrafficCounters after = comm.traffic();
  const int64_t rs_wire = after.WireBytes(OpKind::kReduceScatter) -
                          before.WireBytes(OpKind::kReduceScatter);
  const int64_t ag_wire =
      after.WireBytes(OpKind::kAllGather) - before.WireBytes(OpKind::kAllGather);
  if (rs_wire != 4 * (total - sizes[rank]) || ag_wire != 4 * (total - sizes[(rank + 1) % size])) {
    return absl::InternalError(absl::StrCat("wire bytes ", rs_wire, " and ", ag_wire,
                                            ", expected ", 4 * (total - sizes[rank]), " and ",
                                            4 * (total - sizes[(rank + 1) % size])));
  }
  std::printf("ring %d ranks: reduce-scatter of %lld MB sent %lld MB from rank %d\n", size,
              static_cast<long long>(4 * total >> 20), static_cast<long long>(rs_wire >> 20), rank);
  return absl::OkStatus();
}

// An all-reduce launched while a large reduce-scatter is in flight completes on its own (the ring
// runs on its own thread and tags), and both results are right.
absl::Status IndependentOfEngineCollectives(Communicator& comm) {
  const int size = comm.size(), rank = comm.rank();
  const int64_t n = static_cast<int64_t>(size) << 21;
  at::Tensor input = Input(n, rank);
  ASSIGN_OR_RETURN(auto rs, comm.ReduceScatter(input, input.narrow(0, rank * (n / size), n / size)));
  at::Tensor small = at::zeros({16}, at::kFloat).add_(rank + 1);
  ASSIGN_OR_RETURN(auto ar, comm.AllReduce(small));
  RETURN_IF_ERROR(ar->Wait(comm.timeout()));
  RETURN_IF_ERROR(rs->Wait(comm.timeout()));
  if (small[0].item<float>() != size * (size + 1) / 2.0f) {
    return absl::InternalError("the all-reduce launched during the ring is wrong");
  }
  at::Tensor want = at::zeros({n / size}, at::kFloat);
  for (int r = 0; r < size; ++r) want.add_(Input(n, r).narrow(0, rank * (n / size), n / size));
  if (!at::equal(input.narrow(0, rank * (n / size), n / size), want)) {
    return absl::InternalError("the reduce-scatter around an all-reduce is wrong");
  }
  return absl::OkStatus();
}

class RingTest : public ::testing::TestWithParam<int> {};

TEST_P(RingTest, LargeUnevenShardsExactAndWireBytesAsSent) {
  testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) {
        at::set_num_threads(1);  // ranks share the cores
        ASSERT_OK(LargeShardsAndWireBytes(comm));
        ASSERT_OK(IndependentOfEngineCollectives(comm));
      },
      WithTimeout(absl::Seconds(60)));
}

// The last rank dies after the first collective; the others' ring reduce-scatter fails with
// kUnavailable naming the step and the dead rank, and the communicator refuses later launches.
TEST_P(RingTest, PeerKilledMidRingFailsNamingIt) {
  const int world = GetParam();
  const testing::MultiRankOutcome outcome = testing::LaunchOnRanks(
      world,
      [](Communicator& comm) {
        const int victim = comm.size() - 1;
        at::Tensor t = at::zeros({256}, at::kFloat);
        ASSERT_OK_AND_ASSIGN(auto first, comm.AllReduce(t));
        ASSERT_OK(first->Wait(comm.timeout()));
        if (comm.rank() == victim) {
          absl::SleepFor(absl::Milliseconds(500));
          raise(SIGKILL);
        }
        at::Tensor input = at::zeros({static_cast<int64_t>(comm.size()) << 20}, at::kFloat);
        const int64_t shard = input.numel() / comm.size();
        ASSERT_OK_AND_ASSIGN(
            auto work, comm.ReduceScatter(input, input.narrow(0, comm.rank() * shard, shard)));
        const absl::Status status = work->Wait(comm.timeout() + absl::Seconds(5));
        std::fprintf(stderr, "ring failure on rank %d: %s\n", comm.rank(),
                     status.ToString().c_str());
        EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
        EXPECT_TRUE(absl::StrContains(status.message(), "reduce_scatter #2 failed on rank"))
            << status;
        EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat("rank ", victim))) << status;
        EXPECT_EQ(comm.AllReduce(t).status().code(), absl::StatusCode::kFailedPrecondition);
      },
      WithTimeout(absl::Seconds(3)));
  if (testing::InRankProcess()) return;
  EXPECT_EQ(outcome.launch.exit_code, 128 + 9) << outcome.Transcript();
  for (int r = 0; r + 1 < world; ++r) {
    EXPECT_TRUE(outcome.passed[r]) << "rank " << r << ":\n" << outcome.Transcript();
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::collectives
