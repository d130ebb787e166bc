// The Communicator conformance suite. Every backend runs the same cases in real processes, one per
// rank: the backend's gtest runs RunConformanceCase on every rank through the multi-rank harness
// (testing/multi_rank.h) at several world sizes, joining its own communicator.
#ifndef ORTHOSHARD_COLLECTIVES_TESTING_CONFORMANCE_H_
#define ORTHOSHARD_COLLECTIVES_TESTING_CONFORMANCE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "collectives/communicator.h"

namespace orthoshard::collectives::testing {

// Cases:
//   "arithmetic": every collective, SUM and AVG, fp32 and bf16, even/uneven/empty shards, in-place
//     shards, grouped launches, barrier, traffic counters and launch validation, each compared with
//     the same arithmetic done locally; a reduce-scatter in place and an all-gather of its shard in
//     one group (SUM and AVG), bitwise the reduce-scatter alone.
//   "all_to_all": all-to-all with equal splits, uneven ones with zero rows between some ranks, a
//     rank sending nothing and one receiving nothing, and all empty; rows of shape [] and [3];
//     fp32, bf16 and int64; three all-to-alls and an all-reduce in one group with their traffic
//     counters (calls, the inputs' bytes, the wire bytes of rows sent to other ranks, exactly);
//     launch validation (undefined, non-contiguous, 0-d, overlapping tensors, dtypes, row shapes,
//     split counts, negative splits, sums, equal splits that do not divide).
//   "all_to_all_not_launched": the last rank never launches all-to-all #2; the others must see
//     kDeadlineExceeded from a short Wait and kUnavailable from the engine's timeout, both naming
//     "all_to_all #2" and that rank ("last launched #1"). Needs 2 ranks or more.
//   "sleep_past_timeout": the last rank sleeps past the communicator's timeout before an
//     all-reduce; the others must see kDeadlineExceeded naming "all_reduce #2" and that rank from a
//     short Wait, then kUnavailable from the engine's own timeout; the sleeper gets kUnavailable.
//   "killed_rank": the last rank SIGKILLs itself between two all-reduces; the others must get
//     kUnavailable naming "all_reduce #2" and that rank.
// On a subgroup (a mesh group) `comm.rank()` and `comm.size()` are the group's: "the last rank" is
// the group's last, and errors may name it "rank 1 (global 3, last launched #1)" as well.
// Every tensor of the case lives on `device` (the CPU for Gloo, this rank's GPU for NCCL); expected
// values are computed on the CPU. Not thread-safe: one case at a time per process.
// Returns OK when this rank saw what the contract says; otherwise kInternal describing the
// difference.
absl::Status RunConformanceCase(absl::string_view name, Communicator& comm,
                                at::Device device = at::Device(at::kCPU));

}  // namespace orthoshard::collectives::testing

#endif  // ORTHOSHARD_COLLECTIVES_TESTING_CONFORMANCE_H_
