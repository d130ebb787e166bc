// Running the project's Python (tools/python3: the pinned torch 2.11 wheel and the PyPI packages that
// tools/setup installs) from a C++ test, for references computed live on the test's machine and for
// interop checks against real third-party readers.
//
// A test that uses it lists "//tools:python3" and its script in `data`; under `bazel test` both are
// in the runfiles tree, which is the working directory.
#ifndef ORTHOSHARD_COMMON_TESTING_PYTHON_H_
#define ORTHOSHARD_COMMON_TESTING_PYTHON_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace orthoshard::testing {

// Path of the project's interpreter: $ORTHOSHARD_PYTHON3 if set, else `tools/python3` in the
// working directory (the runfiles tree), else tools/python3 of the source tree that holds `script`
// (resolved through its symlink). Error: kNotFound saying where it looked and that tools/setup
// installs it.
absl::StatusOr<std::string> ProjectPython(const std::string& script);

struct CommandResult {
  int exit_code = -1;  // -1 when the command was killed by a signal or could not start
  std::string output;  // stdout and stderr, interleaved
};

// Runs `python script args...` (each argument shell-quoted) and collects its output.
CommandResult RunPython(const std::string& python, const std::string& script,
                        const std::vector<std::string>& args);

}  // namespace orthoshard::testing

#endif  // ORTHOSHARD_COMMON_TESTING_PYTHON_H_
