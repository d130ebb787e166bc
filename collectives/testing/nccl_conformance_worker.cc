// One rank of the NCCL conformance suite: the same cases as Gloo's (testing/conformance.h), with
// every tensor on this rank's GPU (cuda:LOCAL_RANK). Usage: `nccl_conformance_worker CASE
// TIMEOUT_MS`, started by LaunchLocal, one process per GPU. Prints PassLine on success; exits 1
// with the failure otherwise. Built without --config=cuda it has no NCCL backend: it says so and
// exits 2.
//
// Running it on a GPU machine (none was available when this was written: it compiles and links
// under --config=cuda, but nothing of it has run on a GPU yet):
//   bazel build --config=cuda //collectives:nccl_conformance_test //collectives:launch
//   # The gtest: 1 rank always; 2, 3 and 4 ranks when the machine has that many GPUs (else
//   # skipped). It is tagged manual and requires-gpu, so name it explicitly:
//   bazel test --config=cuda //collectives:nccl_conformance_test
//   # or run the built binary from its runfiles directory:
//   (cd bazel-bin/collectives/nccl_conformance_test.runfiles/orthoshard &&
//    ../../nccl_conformance_test)
//   # One case by hand on N ranks (N <= number of GPUs):
//   bazel-bin/collectives/launch --nproc N
//       bazel-bin/collectives/testing/nccl_conformance_worker arithmetic 20000
// Cases: "arithmetic" (every collective, SUM/AVG, fp32/bf16, uneven and empty shards, in-place
// shards, grouped launches, traffic counters, validation), "sleep_past_timeout" and "killed_rank"
// (2+ ranks). The failure cases depend on c10d's NCCL watchdog: with the default
// TORCH_NCCL_ASYNC_ERROR_HANDLING it may abort a surviving process on a timed-out collective
// instead of letting Wait return kUnavailable; if so, record it (and try
// TORCH_NCCL_ASYNC_ERROR_HANDLING=0) before changing the contract.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "collectives/testing/conformance.h"

int main(int argc, char** argv) {
  using namespace orthoshard::collectives;
  int64_t timeout_ms = 0;
  if (argc != 3 || !absl::SimpleAtoi(argv[2], &timeout_ms)) {
    std::fprintf(stderr, "usage: %s CASE TIMEOUT_MS\n", argv[0]);
    return 2;
  }
#ifndef ORTHOSHARD_CUDA
  std::fprintf(stderr, "%s: built without --config=cuda, so there is no NCCL backend\n", argv[0]);
  return 2;
#else
  auto info = ParseRendezvous(ProcessEnvironment());
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
    return 1;
  }
  NcclOptions options = NcclOptionsFromRendezvous(*info);
  options.timeout = absl::Milliseconds(timeout_ms);
  options.rendezvous_timeout = absl::Seconds(30);
  auto comm = CreateNcclCommunicator(options);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.device));
  const absl::Status status = testing::RunConformanceCase(argv[1], **comm, device);
  if (!status.ok()) {
    std::printf("conformance case %s FAILED on rank %d: %s\n", argv[1], info->rank,
                status.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", testing::PassLine(argv[1], info->rank).c_str());
  std::fflush(stdout);
  // Peers may still be inside a failed collective; leave without joining engine threads.
  std::_Exit(0);
#endif
}
