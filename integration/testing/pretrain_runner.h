// Running the real `pretrain` binary from a C++ test and reading what it printed: the exit code,
// stdout and stderr, and fields of the JSON summary line. The test lists ":pretrain" in its `data`;
// under `bazel test` the runfiles tree is the working directory.
#ifndef ORTHOSHARD_INTEGRATION_TESTING_PRETRAIN_RUNNER_H_
#define ORTHOSHARD_INTEGRATION_TESTING_PRETRAIN_RUNNER_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/testing/temp_dir.h"

namespace orthoshard::integration::testing {

struct RunResult {
  int exit_code = -1;  // 128 + the signal when a signal killed it
  std::string out, err;
};

// $TEST_TMPDIR (common/testing/temp_dir.h).
using ::orthoshard::testing::TempDir;

// The whole file, or "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Runs integration/pretrain with `args` joined by spaces through the shell (so one element may hold
// several flags), stdout and stderr to files in TempDir().
RunResult RunPretrain(const std::vector<std::string>& args);

// The last non-empty line of `text` ("" if none).
std::string LastLine(const std::string& text);

// The value of a number or string key of a flat JSON object, a list's text whole
// ("[1.8438,2.8359]"); "" when absent.
std::string JsonField(const std::string& json, const std::string& key);

// JsonField as a number; a missing key is a test failure (and 0).
double JsonNumber(const std::string& json, const std::string& key);

// TensorBoard scalars: tag -> value at each step 1, 2, ... (TensorBoard stores floats).
using Scalars = std::map<std::string, std::vector<float>>;

// The scalars of the one event file of `dir` (rank 0's); a test failure when there is not one.
Scalars ReadScalars(const std::string& dir);

// What a successful pretrain run printed, and its TensorBoard scalars when it wrote any.
struct TrainingRun {
  std::string out;   // stdout
  std::string json;  // its last line, the JSON summary
  Scalars scalars;
};

// RunPretrain(args), expecting exit code 0 (a test failure otherwise); with `tb` non-empty also
// --log_dir=TempDir()/<tb><n> (n counts the runs), whose scalars are read back.
TrainingRun Pretrain(std::vector<std::string> args, const std::string& tb = "");

// The summary fields two runs of the same steps must agree on to be the same training, bitwise
// (the checksum is the exact sum of every param, printed with 17 digits).
inline const std::vector<std::string> kSameTraining = {"steps", "initial_loss", "final_loss",
                                                       "eval_loss", "param_checksum"};

// Two runs are the same training: every one of `fields` of their JSON summaries has the same
// text (the param checksum is printed with 17 digits, so equal text is bitwise-equal params).
void ExpectSameTraining(const TrainingRun& a, const TrainingRun& b, const std::string& what,
                        const std::vector<std::string>& fields);

// Each case's arguments (one string, several flags) make pretrain exit 2 before any rank starts:
// nothing on stdout, exactly one line on stderr, starting "pretrain: " and containing the case's
// message, and no --log_dir written.
void ExpectRefusedBeforeLaunch(const std::vector<std::pair<std::string, std::string>>& cases);

// `args` followed by `extra`.
std::vector<std::string> With(std::vector<std::string> args,
                              const std::vector<std::string>& extra);

}  // namespace orthoshard::integration::testing

#endif  // ORTHOSHARD_INTEGRATION_TESTING_PRETRAIN_RUNNER_H_
