// The crash-safe directory protocol of checkpoints under one root directory:
//
//   root/step_000123.tmp/   being written (any crash leaves only this behind)
//   root/step_000123/       complete: files and directory fsynced before the rename
//   root/latest             "step_000123\n", replaced atomically after the rename
//
// Save: BeginCheckpoint → every rank writes its files into the returned `.tmp` directory → the
// caller runs a barrier across ranks → exactly one rank calls CommitCheckpoint. These are local
// file-system operations with no barrier of their own; at most one save may be in flight per root
// (CommitCheckpoint removes other `.tmp` directories as stale). Load: ResolveLatest (or
// ResolveCheckpointDir for a path that may be either a root or a step directory).
//
// `latest` is the truth. A complete step directory that `latest` does not name and that is newer
// than it (a crash between the rename and the pointer update, or an operator who pointed `latest`
// back at an older step) belongs to an abandoned timeline: it is left alone, not counted by
// keep_last, and replaced when a save of the same step commits:
//   rename step_N → step_N.replaced, rename step_N.tmp → step_N, fsync, move `latest`, remove
//   step_N.replaced (GarbageCollect removes one left by a crash in between).
#ifndef ORTHOSHARD_CHECKPOINT_COMMIT_H_
#define ORTHOSHARD_CHECKPOINT_COMMIT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/file_util.h"

namespace orthoshard::checkpoint {

// File name of the pointer to the newest complete checkpoint.
inline constexpr char kLatestFileName[] = "latest";

// "step_000123" for step 123 (at least six digits; wider steps print in full).
// Precondition: step >= 0.
std::string StepDirName(int64_t step);

// Step number of a complete-checkpoint directory name ("step_000123" → 123); nullopt for anything
// else, `.tmp` directories included.
std::optional<int64_t> ParseStepDirName(absl::string_view name);

struct CommitOptions {
  // Complete checkpoints up to `latest` to keep after a commit (the newest ones); 0 keeps all.
  // The one `latest` points at, and any newer one, is never deleted.
  int keep_last = 3;
};

// Creates `root` if needed and an empty `root`/step_NNNNNN.tmp/ (a leftover one from a crashed save
// of the same step is removed first). Returns its path. Errors: kInvalidArgument for step < 0;
// kAlreadyExists if `latest` names step_NNNNNN/ or a non-directory stands at step_NNNNNN; OS
// errors naming the path.
absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, int64_t step);

// Commits step `step`: fsyncs every file in step_NNNNNN.tmp/ and the directory, renames it to
// step_NNNNNN/ (replacing an abandoned step_NNNNNN/, see above), fsyncs `root`, atomically points
// `latest` at it, then applies `options.keep_last` and removes stale `.tmp` and `.replaced`
// directories. Call on one rank after all ranks finished writing. Errors: kNotFound if the `.tmp`
// directory is missing; kAlreadyExists as BeginCheckpoint; OS errors naming the path. A failure
// before the rename leaves `latest` unchanged.
absl::Status CommitCheckpoint(const std::string& root, int64_t step,
                              const CommitOptions& options = {});

// Deletes the complete checkpoints older than `latest` beyond the newest `keep_last` of those up
// to `latest` (never `latest`'s own, never a newer one) and every `*.tmp` and `*.replaced`
// directory. `keep_last` 0 keeps all complete ones. Errors: OS errors.
absl::Status GarbageCollect(const std::string& root, int keep_last);

// Steps of the complete checkpoints newer than the one `latest` names (an abandoned timeline, see
// above), ascending; all of them when there is no `latest`. Errors: as ResolveLatest for a corrupt
// pointer; OS errors.
absl::StatusOr<std::vector<int64_t>> CheckpointsNewerThanLatest(const std::string& root);

// Steps of the complete checkpoints in `root`, ascending. Errors: OS errors.
absl::StatusOr<std::vector<int64_t>> ListCheckpoints(const std::string& root);

// The directory `latest` points at. Errors: kNotFound "checkpoint root R: pointer file R/latest is
// missing (no committed checkpoint)"; kDataLoss if its contents are not a step directory name or
// it is not a regular file; kNotFound "... R/latest points at 'step_000123' but R/step_000123 does
// not exist" (dangling).
absl::StatusOr<std::string> ResolveLatest(const std::string& root);

// One writer per checkpoint root: an exclusive advisory lock (flock) on `root`/.lock, held while
// the object lives (and released by the kernel when the process dies, so a crash never leaves a
// stale lock). The file records who holds it ("pid 1234 on host a1 since 2026-11-23 12:00:00
// UTC: pretrain rank 0"), for the error another run gets. Two runs in one root would commit over
// each other's steps and garbage-collect each other's in-flight saves. flock works across
// processes on one machine and on NFSv4 and Lustre mounts with locking enabled.
class RootLock {
 public:
  const std::string& path() const { return file_.path(); }

 private:
  explicit RootLock(File file) : file_(std::move(file)) {}
  friend absl::StatusOr<RootLock> LockRoot(const std::string&, absl::string_view);

  File file_;  // closing it releases the flock
};

// Creates `root` if needed and takes its lock without waiting; `holder` describes the caller for
// the error other runs get. Errors: kFailedPrecondition "checkpoint root R is in use by another run
// (pid 1234 on host a1 since ...: pretrain rank 0); wait for it to end or choose another
// directory"; OS errors naming the path.
absl::StatusOr<RootLock> LockRoot(const std::string& root, absl::string_view holder);

// `path` itself if it holds a manifest, else ResolveLatest(path). Errors: those of ResolveLatest,
// with a note that `path` holds no manifest either.
absl::StatusOr<std::string> ResolveCheckpointDir(const std::string& path);

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_COMMIT_H_
