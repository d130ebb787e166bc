#include "checkpoint/commit.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {
namespace {

constexpr absl::string_view kStepPrefix = "step_";
constexpr absl::string_view kTmpSuffix = ".tmp";

// The step dir name `latest` names, or nullopt if there is no pointer file.
absl::StatusOr<std::optional<std::string>> ReadLatestName(const std::string& root) {
  const std::string pointer = JoinPath(root, kLatestFileName);
  absl::StatusOr<std::string> contents = ReadFileToString(pointer);
  if (absl::IsNotFound(contents.status())) return std::optional<std::string>();
  if (!contents.ok()) return contents.status();
  std::string name(absl::StripAsciiWhitespace(*contents));
  if (!ParseStepDirName(name).has_value()) {
    return absl::DataLossError(absl::StrCat("checkpoint root ", root, ": pointer file ", pointer,
                                            " holds \"", absl::CHexEscape(name),
                                            "\", not a step directory name"));
  }
  return std::optional<std::string>(name);
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%06d", step); }

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.size() < 6) return std::nullopt;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t step;
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;
  if (StepDirName(step) != absl::StrCat(kStepPrefix, name)) return std::nullopt;
  return step;
}

absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step is ", step, ", expected >= 0"));
  RETURN_IF_ERROR(MakeDir(root));
  const std::string final_dir = JoinPath(root, StepDirName(step));
  ASSIGN_OR_RETURN(bool committed, PathExists(final_dir));
  if (committed) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", final_dir, " is already committed"));
  }
  const std::string tmp_dir = final_dir + std::string(kTmpSuffix);
  RETURN_IF_ERROR(RemoveRecursively(tmp_dir));
  RETURN_IF_ERROR(MakeDir(tmp_dir));
  RETURN_IF_ERROR(SyncDir(root));
  return tmp_dir;
}

absl::Status CommitCheckpoint(const std::string& root, int64_t step, const CommitOptions& options) {
  const std::string final_dir = JoinPath(root, StepDirName(step));
  const std::string tmp_dir = final_dir + std::string(kTmpSuffix);
  ASSIGN_OR_RETURN(bool committed, PathExists(final_dir));
  if (committed) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", final_dir, " is already committed"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(tmp_dir));
  for (const std::string& name : names) RETURN_IF_ERROR(SyncFile(JoinPath(tmp_dir, name)));
  RETURN_IF_ERROR(SyncDir(tmp_dir));
  RETURN_IF_ERROR(Rename(tmp_dir, final_dir));
  RETURN_IF_ERROR(SyncDir(root));
  RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(root, kLatestFileName), StepDirName(step) + "\n"));
  return GarbageCollect(root, options.keep_last);
}

absl::StatusOr<std::vector<int64_t>> ListCheckpoints(const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    std::optional<int64_t> step = ParseStepDirName(name);
    if (!step.has_value()) continue;
    ASSIGN_OR_RETURN(bool is_dir, IsDirectory(JoinPath(root, name)));
    if (is_dir) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::Status GarbageCollect(const std::string& root, int keep_last) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  for (const std::string& name : names) {
    if (absl::EndsWith(name, kTmpSuffix) &&
        ParseStepDirName(absl::string_view(name).substr(0, name.size() - kTmpSuffix.size()))) {
      RETURN_IF_ERROR(RemoveRecursively(JoinPath(root, name)));
    }
  }
  if (keep_last <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<std::string> latest, ReadLatestName(root));
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCheckpoints(root));
  const size_t keep = static_cast<size_t>(keep_last);
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    const std::string name = StepDirName(steps[i]);
    if (latest.has_value() && *latest == name) continue;
    RETURN_IF_ERROR(RemoveRecursively(JoinPath(root, name)));
  }
  return SyncDir(root);
}

absl::StatusOr<std::string> ResolveLatest(const std::string& root) {
  const std::string pointer = JoinPath(root, kLatestFileName);
  ASSIGN_OR_RETURN(std::optional<std::string> latest, ReadLatestName(root));
  if (!latest.has_value()) {
    return absl::NotFoundError(absl::StrCat("checkpoint root ", root, ": pointer file ", pointer,
                                            " is missing (no committed checkpoint)"));
  }
  const std::string dir = JoinPath(root, *latest);
  absl::StatusOr<bool> is_dir = IsDirectory(dir);
  if (absl::IsNotFound(is_dir.status()) || (is_dir.ok() && !*is_dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint root ", root, ": ", pointer,
                                            " points at '", *latest, "' but ", dir,
                                            " does not exist"));
  }
  if (!is_dir.ok()) return is_dir.status();
  return dir;
}

absl::StatusOr<std::string> ResolveCheckpointDir(const std::string& path) {
  ASSIGN_OR_RETURN(bool has_manifest, PathExists(JoinPath(path, kManifestFileName)));
  if (has_manifest) return path;
  absl::StatusOr<std::string> dir = ResolveLatest(path);
  if (!dir.ok()) {
    return absl::Status(dir.status().code(),
                        absl::StrCat(dir.status().message(), "; ", path, " holds no ",
                                     kManifestFileName, " either"));
  }
  return dir;
}

}  // namespace orthoshard::checkpoint
