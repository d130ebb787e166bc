// The Communicator conformance suite. Every backend runs the same cases in real processes (one per
// rank, started by LaunchLocal): a backend-specific worker binary creates its communicator from the
// rendezvous environment and calls RunConformanceCase; the backend's gtest starts the worker at
// several world sizes with RunConformanceJob and checks every rank reported success.
#ifndef ORTHOSHARD_COLLECTIVES_TESTING_CONFORMANCE_H_
#define ORTHOSHARD_COLLECTIVES_TESTING_CONFORMANCE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/launcher.h"

namespace orthoshard::collectives::testing {

// Cases:
//   "arithmetic": every collective, SUM and AVG, fp32 and bf16, even/uneven/empty shards, in-place
//     shards, grouped launches, barrier, traffic counters and launch validation, each compared with
//     the same arithmetic done locally.
//   "sleep_past_timeout": the last rank sleeps past the communicator's timeout before an
//     all-reduce; the others must see kDeadlineExceeded naming "all_reduce #2" and that rank from a
//     short Wait, then kUnavailable from the engine's own timeout; the sleeper gets kUnavailable.
//   "killed_rank": the last rank SIGKILLs itself between two all-reduces; the others must get
//     kUnavailable naming "all_reduce #2" and that rank.
// Every tensor of the case lives on `device` (the CPU for Gloo, this rank's GPU for NCCL); expected
// values are computed on the CPU. Not thread-safe: one case at a time per process.
// Returns OK when this rank saw what the contract says; otherwise kInternal describing the
// difference.
absl::Status RunConformanceCase(absl::string_view name, Communicator& comm,
                                at::Device device = at::Device(at::kCPU));

// The line a worker prints after a case passed on its rank.
std::string PassLine(absl::string_view name, int rank);

struct ConformanceJob {
  LaunchResult launch;
  std::vector<std::string> lines;  // every output line of every rank, prefixed "[rank N] "
};

// Starts `world_size` processes of `worker` with arguments {case_name, timeout in seconds} and
// collects their output. Errors: those of LaunchLocal (the job is bounded by 60 s).
absl::StatusOr<ConformanceJob> RunConformanceJob(const std::string& worker,
                                                 absl::string_view case_name, int world_size,
                                                 absl::Duration timeout);

}  // namespace orthoshard::collectives::testing

#endif  // ORTHOSHARD_COLLECTIVES_TESTING_CONFORMANCE_H_
