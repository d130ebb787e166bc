// One rank of the Gloo conformance suite: `gloo_conformance_worker CASE TIMEOUT_MS`, started by
// LaunchLocal. Prints PassLine on success; exits 1 with the failure otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "collectives/gloo_communicator.h"
#include "collectives/testing/conformance.h"

int main(int argc, char** argv) {
  using namespace orthoshard::collectives;
  int64_t timeout_ms = 0;
  if (argc != 3 || !absl::SimpleAtoi(argv[2], &timeout_ms)) {
    std::fprintf(stderr, "usage: %s CASE TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  auto comm = JoinGlooFromEnvironment(absl::Milliseconds(timeout_ms), absl::Seconds(30));
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const absl::Status status = testing::RunConformanceCase(argv[1], **comm);
  if (!status.ok()) {
    std::printf("conformance case %s FAILED on rank %d: %s\n", argv[1], (*comm)->rank(),
                status.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", testing::PassLine(argv[1], (*comm)->rank()).c_str());
  std::fflush(stdout);
  // Peers may still be inside a failed collective; leave without joining engine threads.
  std::_Exit(0);
}
