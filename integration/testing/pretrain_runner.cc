#include "integration/testing/pretrain_runner.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace orthoshard::integration::testing {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

RunResult RunPretrain(const std::vector<std::string>& args) {
  static int counter = 0;
  const std::string base = absl::StrCat(TempDir(), "/run", counter++);
  const std::string command = absl::StrCat("integration/pretrain ", absl::StrJoin(args, " "),
                                           " >", base, ".out 2>", base, ".err");
  const int status = std::system(command.c_str());
  RunResult run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = ReadFile(base + ".out");
  run.err = ReadFile(base + ".err");
  return run;
}

std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

std::string JsonField(const std::string& json, const std::string& key) {
  const std::string needle = absl::StrCat("\"", key, "\":");
  const size_t at = json.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = at + needle.size();
  const size_t end = json.find_first_of(",}", begin);
  std::string value = json.substr(begin, end - begin);
  if (!value.empty() && value.front() == '"') value = value.substr(1, value.size() - 2);
  return value;
}

double JsonNumber(const std::string& json, const std::string& key) {
  const std::string value = JsonField(json, key);
  EXPECT_FALSE(value.empty()) << "no key " << key << " in " << json;
  return std::strtod(value.c_str(), nullptr);
}

}  // namespace orthoshard::integration::testing
