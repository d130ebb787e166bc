// Running the real `pretrain` binary from a C++ test and reading what it printed: the exit code,
// stdout and stderr, and fields of the JSON summary line. The test lists ":pretrain" in its `data`;
// under `bazel test` the runfiles tree is the working directory.
#ifndef ORTHOSHARD_INTEGRATION_TESTING_PRETRAIN_RUNNER_H_
#define ORTHOSHARD_INTEGRATION_TESTING_PRETRAIN_RUNNER_H_

#include <string>
#include <vector>

namespace orthoshard::integration::testing {

struct RunResult {
  int exit_code = -1;  // 128 + the signal when a signal killed it
  std::string out, err;
};

// $TEST_TMPDIR.
std::string TempDir();

// The whole file, or "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Runs integration/pretrain with `args` joined by spaces through the shell (so one element may hold
// several flags), stdout and stderr to files in TempDir().
RunResult RunPretrain(const std::vector<std::string>& args);

// The last non-empty line of `text` ("" if none).
std::string LastLine(const std::string& text);

// The value of a number or string key of a flat JSON object ("" when absent).
std::string JsonField(const std::string& json, const std::string& key);

// JsonField as a number; a missing key is a test failure (and 0).
double JsonNumber(const std::string& json, const std::string& key);

}  // namespace orthoshard::integration::testing

#endif  // ORTHOSHARD_INTEGRATION_TESTING_PRETRAIN_RUNNER_H_
