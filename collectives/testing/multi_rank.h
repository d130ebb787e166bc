// The one multi-rank test harness: a test body that runs on N real ranks, each a process of the
// test binary itself with a communicator over loopback, reported as ordinary gtest failures.
//
//   TEST(DistributedOptimizerTest, ShardedMatchesSingleProcess) {
//     RunOnRanks(3, [](collectives::Communicator& comm) {
//       ASSERT_OK(...);                  // gtest assertions, on every rank
//       EXPECT_EQ(..., comm.rank());
//     });
//   }
//
// How it works. In the test process RunOnRanks starts `world` copies of this binary through
// LaunchLocal (the launcher pretrain uses: torchrun's environment, a hosted store, output prefixed
// "[rank N] "), each filtered to the running test and told which RunOnRanks call of it to run
// (ORTHOSHARD_MULTI_RANK_CASE). In a rank process that call joins the communicator, runs the body,
// prints "multi-rank case <test>#<call> passed on rank R" (or "failed") and ends the process
// without tearing down the engine (peers may still be inside a collective); the other calls of the
// test return at once there. Back in the test process, every rank that did not pass becomes one gtest
// failure carrying that rank's output, so an EXPECT that fails on rank 2 reads as such. Every rank's
// output also goes to the test's stdout as it arrives, prefixed "[rank N] ".
//
// Cases are registered once, as tests; a test may call RunOnRanks several times (save at 2 ranks,
// resume at 3). Code outside the bodies runs in the test process and in every rank process: keep it
// to set-up. Files shared between calls go to ::testing::TempDir(), the same for every process of a
// test.
#ifndef ORTHOSHARD_COLLECTIVES_TESTING_MULTI_RANK_H_
#define ORTHOSHARD_COLLECTIVES_TESTING_MULTI_RANK_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/launch/launcher.h"

namespace orthoshard::collectives::testing {

struct MultiRankOptions {
  // Bound on the whole launch; then every rank is killed and the test fails.
  absl::Duration launch_timeout = absl::Seconds(240);
  // The communicator's timeout (every collective, and how long a rank waits for a dead peer).
  absl::Duration collective_timeout = absl::Seconds(60);
  // After the first rank fails, the others get this long to exit.
  absl::Duration grace_period = absl::Seconds(20);
  // Extra environment for the ranks.
  std::vector<std::pair<std::string, std::string>> env;
  // How a rank joins: Gloo from the launcher's environment with `collective_timeout` when empty
  // (the NCCL conformance test passes its own).
  std::function<absl::StatusOr<std::unique_ptr<Communicator>>(absl::Duration timeout)> join;
};

// MultiRankOptions with the communicator's timeout `collective` and the whole launch bounded by
// `launch`; the rest default.
inline MultiRankOptions WithTimeouts(absl::Duration collective, absl::Duration launch) {
  MultiRankOptions options;
  options.collective_timeout = collective;
  options.launch_timeout = launch;
  return options;
}

// What each rank of a launch did, for tests that expect a rank to die.
struct MultiRankOutcome {
  LaunchResult launch;
  std::vector<bool> passed;                    // per rank: printed its "passed" line
  std::vector<std::vector<std::string>> lines;  // per rank: its output, without the prefix
  // Every line of every rank, with the "[rank N] " prefix, in arrival order.
  std::string Transcript() const;
};

// Runs `body` on `world` ranks and returns what each did (the test process's view; in a rank
// process the matching call never returns). Fails the test (ADD_FAILURE) only if the launch itself
// fails. Must be called from a gtest test body.
MultiRankOutcome LaunchOnRanks(int world, const std::function<void(Communicator&)>& body,
                               const MultiRankOptions& options = {});

// LaunchOnRanks, then one gtest failure per rank that did not pass, with its output.
void RunOnRanks(int world, const std::function<void(Communicator&)>& body,
                const MultiRankOptions& options = {});

// True in a rank process of any RunOnRanks call (for set-up code that must not run there).
bool InRankProcess();

}  // namespace orthoshard::collectives::testing

#endif  // ORTHOSHARD_COLLECTIVES_TESTING_MULTI_RANK_H_
