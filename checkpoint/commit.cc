#include "checkpoint/commit.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {
namespace {

constexpr absl::string_view kStepPrefix = "step_";
constexpr absl::string_view kTmpSuffix = ".tmp";
constexpr absl::string_view kReplacedSuffix = ".replaced";
constexpr char kLockFileName[] = ".lock";

// The step dir name `latest` names, or nullopt if there is no pointer file.
absl::StatusOr<std::optional<std::string>> ReadLatestName(const std::string& root) {
  const std::string pointer = JoinPath(root, kLatestFileName);
  absl::StatusOr<bool> is_dir = IsDirectory(pointer);
  if (is_dir.ok() && *is_dir) {
    return absl::DataLossError(absl::StrCat("checkpoint root ", root, ": pointer file ", pointer,
                                            " is a directory, expected a file naming a step "
                                            "directory (e.g. \"step_000123\")"));
  }
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

namespace {

// kAlreadyExists if `latest` names step `step` (that checkpoint is the one a run resumes from) or
// something that is not a directory stands where its directory would go.
absl::Status CheckReplaceable(const std::string& root, int64_t step) {
  ASSIGN_OR_RETURN(std::optional<std::string> latest, ReadLatestName(root));
  const std::string final_dir = JoinPath(root, StepDirName(step));
  if (latest.has_value() && *latest == StepDirName(step)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", final_dir,
                                                 " is already committed and named by `latest`"));
  }
  ASSIGN_OR_RETURN(const bool exists, PathExists(final_dir));
  if (exists) {
    ASSIGN_OR_RETURN(const bool is_dir, IsDirectory(final_dir));
    if (!is_dir) {
      return absl::AlreadyExistsError(
          absl::StrCat(final_dir, " exists and is not a checkpoint directory"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step is ", step, ", expected >= 0"));
  RETURN_IF_ERROR(MakeDir(root));
  RETURN_IF_ERROR(CheckReplaceable(root, step));
  const std::string final_dir = JoinPath(root, StepDirName(step));
  const std::string tmp_dir = final_dir + std::string(kTmpSuffix);
  RETURN_IF_ERROR(RemoveRecursively(tmp_dir));
  RETURN_IF_ERROR(MakeDir(tmp_dir));
  RETURN_IF_ERROR(SyncDir(root));
  return tmp_dir;
}

absl::Status CommitCheckpoint(const std::string& root, int64_t step, const CommitOptions& options) {
  const std::string final_dir = JoinPath(root, StepDirName(step));
  const std::string tmp_dir = final_dir + std::string(kTmpSuffix);
  RETURN_IF_ERROR(CheckReplaceable(root, step));
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(tmp_dir));
  for (const std::string& name : names) RETURN_IF_ERROR(SyncFile(JoinPath(tmp_dir, name)));
  RETURN_IF_ERROR(SyncDir(tmp_dir));
  // An abandoned step_N (see commit.h) is moved aside, not deleted, until `latest` names the new one.
  const std::string replaced = final_dir + std::string(kReplacedSuffix);
  ASSIGN_OR_RETURN(const bool abandoned, PathExists(final_dir));
  if (abandoned) {
    RETURN_IF_ERROR(RemoveRecursively(replaced));
    RETURN_IF_ERROR(Rename(final_dir, replaced));
  }
  RETURN_IF_ERROR(Rename(tmp_dir, final_dir));
  RETURN_IF_ERROR(SyncDir(root));
  RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(root, kLatestFileName), StepDirName(step) + "\n"));
  if (abandoned) RETURN_IF_ERROR(RemoveRecursively(replaced));
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

absl::StatusOr<std::vector<int64_t>> CheckpointsNewerThanLatest(const std::string& root) {
  ASSIGN_OR_RETURN(std::optional<std::string> latest, ReadLatestName(root));
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCheckpoints(root));
  if (!latest.has_value()) return steps;
  const int64_t latest_step = *ParseStepDirName(*latest);
  std::vector<int64_t> newer;
  for (int64_t step : steps) {
    if (step > latest_step) newer.push_back(step);
  }
  return newer;
}

absl::Status GarbageCollect(const std::string& root, int keep_last) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  for (const std::string& name : names) {
    for (absl::string_view suffix : {kTmpSuffix, kReplacedSuffix}) {
      if (absl::EndsWith(name, suffix) &&
          ParseStepDirName(absl::string_view(name).substr(0, name.size() - suffix.size()))) {
        RETURN_IF_ERROR(RemoveRecursively(JoinPath(root, name)));
      }
    }
  }
  if (keep_last <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<std::string> latest, ReadLatestName(root));
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCheckpoints(root));
  if (latest.has_value()) {
    // Only the timeline up to `latest` is counted; newer checkpoints are abandoned, not old.
    const int64_t latest_step = *ParseStepDirName(*latest);
    steps.erase(std::remove_if(steps.begin(), steps.end(),
                               [&](int64_t step) { return step >= latest_step; }),
                steps.end());
  }
  // `latest`'s own checkpoint is one of the keep_last.
  const size_t keep = static_cast<size_t>(keep_last) - (latest.has_value() ? 1 : 0);
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    RETURN_IF_ERROR(RemoveRecursively(JoinPath(root, StepDirName(steps[i]))));
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

absl::StatusOr<RootLock> LockRoot(const std::string& root, absl::string_view holder) {
  RETURN_IF_ERROR(MakeDir(root));
  const std::string path = JoinPath(root, kLockFileName);
  File file(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644), path);
  if (file.fd() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("open(", path, "): ", std::strerror(errno)));
  }
  if (::flock(file.fd(), LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error != EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("flock(", path, "): ", std::strerror(error)));
    }
    std::string who(512, '\0');
    const ssize_t n = ::pread(file.fd(), who.data(), who.size(), 0);
    who.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint root ", root, " is in use by another run (",
        who.empty() ? std::string("holder unknown") : std::string(absl::StripAsciiWhitespace(who)),
        "); wait for it to end or choose another directory"));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string who =
      absl::StrCat("pid ", ::getpid(), " on host ", host, " since ",
                   absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone()),
                   ": ", holder, "\n");
  if (::ftruncate(file.fd(), 0) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("ftruncate(", path, "): ", std::strerror(errno)));
  }
  RETURN_IF_ERROR(file.WriteAll(who.data(), who.size()));
  return RootLock(std::move(file));
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
