// Where a test writes its files: Bazel's TEST_TMPDIR (a fresh directory per test, removed after it),
// or /tmp when the binary runs outside `bazel test`. No trailing slash: TempDir() + "/name".
#ifndef ORTHOSHARD_COMMON_TESTING_TEMP_DIR_H_
#define ORTHOSHARD_COMMON_TESTING_TEMP_DIR_H_

#include <cstdlib>
#include <string>

namespace orthoshard::testing {

inline std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

}  // namespace orthoshard::testing

#endif  // ORTHOSHARD_COMMON_TESTING_TEMP_DIR_H_
