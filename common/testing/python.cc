#include "common/testing/python.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace orthoshard::testing {
namespace {

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

}  // namespace

absl::StatusOr<std::string> ProjectPython(const std::string& script) {
  if (const char* env = std::getenv("ORTHOSHARD_PYTHON3"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  if (access("tools/python3", X_OK) == 0) return std::string("tools/python3");
  char resolved[PATH_MAX];
  if (realpath(script.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no tools/python3 in the working directory, cannot resolve ", script,
        " and ORTHOSHARD_PYTHON3 is not set (list //tools:python3 and the script in the test's "
        "data)"));
  }
  // <workspace>/<package...>/<script>: walk up to the directory that holds tools/python3.
  std::string dir = resolved;
  while (dir.rfind('/') != std::string::npos && dir.rfind('/') > 0) {
    dir = dir.substr(0, dir.rfind('/'));
    const std::string python = absl::StrCat(dir, "/tools/python3");
    if (access(python.c_str(), X_OK) == 0) return python;
  }
  return absl::NotFoundError(absl::StrCat("no executable tools/python3 above ", resolved,
                                          ": run tools/setup"));
}

CommandResult RunPython(const std::string& python, const std::string& script,
                        const std::vector<std::string>& args) {
  std::string command = absl::StrCat(ShellQuote(python), " ", ShellQuote(script));
  for (const std::string& a : args) absl::StrAppend(&command, " ", ShellQuote(a));
  absl::StrAppend(&command, " 2>&1");
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    result.output = absl::StrCat("popen(", command, ") failed");
    return result;
  }
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace orthoshard::testing
