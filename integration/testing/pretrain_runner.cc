#include "integration/testing/pretrain_runner.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "integration/metrics/tensorboard.h"

namespace orthoshard::integration::testing {

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
  if (json[begin] == '[') return json.substr(begin, json.find(']', begin) + 1 - begin);
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

Scalars ReadScalars(const std::string& dir) {
  Scalars out;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files.push_back(entry.path().string());
  }
  EXPECT_EQ(files.size(), 1u) << dir;
  if (files.size() != 1) return out;
  absl::StatusOr<std::vector<TbEvent>> events = ReadEventFile(files[0]);
  EXPECT_TRUE(events.ok()) << events.status();
  if (!events.ok()) return out;
  for (const TbEvent& e : *events) {
    for (const ScalarValue& v : e.scalars) {
      if (e.step >= 1) out[v.tag].push_back(v.value);
    }
  }
  return out;
}

TrainingRun Pretrain(std::vector<std::string> args, const std::string& tb) {
  static int runs = 0;
  std::string dir;
  if (!tb.empty()) {
    dir = absl::StrCat(TempDir(), "/", tb, runs++);
    args.push_back("--log_dir=" + dir);
  }
  const RunResult run = RunPretrain(args);
  EXPECT_EQ(run.exit_code, 0) << absl::StrJoin(args, " ") << "\n" << run.out << run.err;
  TrainingRun out;
  out.out = run.out;
  out.json = LastLine(run.out);
  if (run.exit_code == 0 && !dir.empty()) out.scalars = ReadScalars(dir);
  return out;
}

void ExpectSameTraining(const TrainingRun& a, const TrainingRun& b, const std::string& what,
                        const std::vector<std::string>& fields) {
  for (const std::string& field : fields) {
    EXPECT_EQ(JsonField(a.json, field), JsonField(b.json, field)) << what << ": " << field;
  }
  EXPECT_FALSE(JsonField(a.json, "param_checksum").empty()) << a.json;
}

void ExpectRefusedBeforeLaunch(const std::vector<std::pair<std::string, std::string>>& cases) {
  const std::string log_dir = TempDir() + "/must_not_exist";
  for (const auto& [args, message] : cases) {
    const RunResult run = RunPretrain({args, "--log_dir=" + log_dir});
    EXPECT_EQ(run.exit_code, 2) << args << ": " << run.err;
    EXPECT_EQ(run.out, "") << args;
    EXPECT_EQ(run.err.rfind("pretrain: ", 0), 0u) << args << ": " << run.err;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << ": " << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << args << ": " << run.err;
  }
  EXPECT_FALSE(std::filesystem::exists(log_dir));
}

std::vector<std::string> With(std::vector<std::string> args,
                              const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace orthoshard::integration::testing
