// `launch --nproc N [--grace_seconds S] BINARY [ARGS...]`: runs N ranks of BINARY on this machine
// with torchrun's environment (see launcher.h) and exits with the first non-zero exit code.
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "collectives/launch/launcher.h"

int main(int argc, char** argv) {
  orthoshard::collectives::LaunchOptions options;
  int i = 1;
  for (; i + 1 < argc && std::strncmp(argv[i], "--", 2) == 0; i += 2) {
    int value = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &value)) break;
    if (std::strcmp(argv[i], "--nproc") == 0) {
      options.nprocs = value;
    } else if (std::strcmp(argv[i], "--grace_seconds") == 0) {
      options.grace_period = absl::Seconds(value);
    } else {
      break;
    }
  }
  if (i >= argc || std::strncmp(argv[i], "--", 2) == 0) {
    std::fprintf(stderr, "usage: %s --nproc N [--grace_seconds S] BINARY [ARGS...]\n", argv[0]);
    return 2;
  }
  options.binary = argv[i];
  for (++i; i < argc; ++i) options.args.emplace_back(argv[i]);
  auto result = orthoshard::collectives::LaunchLocal(options);
  if (!result.ok()) {
    std::fprintf(stderr, "launch: %s\n", result.status().ToString().c_str());
    return 1;
  }
  if (!result->stopped_ranks.empty()) {
    std::fprintf(stderr, "launch: %s\n",
                 orthoshard::collectives::DescribeStopped(result->stopped_ranks).c_str());
  }
  if (result->exit_code != 0) {
    std::fprintf(stderr, "launch: rank %d failed first with %s\n", result->first_failed_rank,
                 orthoshard::collectives::DescribeExitCode(result->exit_code).c_str());
  }
  return result->exit_code;
}
