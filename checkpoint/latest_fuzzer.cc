// Fuzz target for the `latest` pointer (checkpoint/commit.h): the input is the pointer file's
// contents. ResolveLatest either names the one step directory that exists, or fails with kDataLoss
// (not a step directory name) or kNotFound (dangling); ParseStepDirName accepts exactly the names
// StepDirName produces.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "checkpoint/commit.h"

namespace {

using ::orthoshard::checkpoint::kLatestFileName;
using ::orthoshard::checkpoint::ParseStepDirName;
using ::orthoshard::checkpoint::ResolveLatest;
using ::orthoshard::checkpoint::StepDirName;

// A checkpoint root holding step_000042/ only, made once per process (under TEST_TMPDIR in tests).
const std::string& Root() {
  static const std::string* root = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/latest_fuzzer.XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) std::abort();
    auto* path = new std::string(dir);
    if (mkdir((*path + "/" + StepDirName(42)).c_str(), 0755) != 0) std::abort();
    return path;
  }();
  return *root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<int64_t> step = ParseStepDirName(text);
  if (step.has_value() && StepDirName(*step) != text) std::abort();

  const std::string pointer = Root() + "/" + kLatestFileName;
  const int fd = open(pointer.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) std::abort();
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) std::abort();
  close(fd);
  absl::StatusOr<std::string> dir = ResolveLatest(Root());
  const std::optional<int64_t> named =
      ParseStepDirName(absl::StripAsciiWhitespace(text));
  if (dir.ok()) {
    if (named != 42 || *dir != Root() + "/" + StepDirName(42)) std::abort();
  } else if (dir.status().code() == absl::StatusCode::kNotFound) {
    if (!named.has_value() || *named == 42) std::abort();
  } else if (dir.status().code() != absl::StatusCode::kDataLoss || named.has_value()) {
    std::abort();
  }
  return 0;
}
