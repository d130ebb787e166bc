// POSIX file helpers for checkpoint I/O: every errno becomes an absl::Status naming the path.
//
// This is the one place where checkpoint/ talks to the OS. Functions retry EINTR and short
// reads/writes; errors carry the operation, the path and strerror text, e.g.
//   "open(/ckpt/step_000001.tmp/rank0.safetensors): No such file or directory".
#ifndef ORTHOSHARD_CHECKPOINT_FILE_UTIL_H_
#define ORTHOSHARD_CHECKPOINT_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::checkpoint {

// Converts an errno value from `op` on `path` into a Status: ENOENT → kNotFound, EEXIST →
// kAlreadyExists, EACCES/EPERM → kPermissionDenied, ENOSPC/EDQUOT → kResourceExhausted,
// anything else → kInternal. The message is "<op>(<path>): <strerror>".
absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path);

// An open file descriptor, closed on destruction. Move-only.
class File {
 public:
  File() = default;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  // Opens a regular file for reading; never blocks (a FIFO is refused, not waited on). Errors:
  // kNotFound, kPermissionDenied, kInvalidArgument "open(<path>): a FIFO, expected a regular file"
  // (also a directory, a socket, a device), kInternal.
  static absl::StatusOr<File> OpenForRead(const std::string& path);
  // Creates (truncating) for writing with mode 0644.
  static absl::StatusOr<File> CreateForWrite(const std::string& path);

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Writes all of `data` at the current position (loops on short writes and EINTR).
  absl::Status WriteAll(const void* data, size_t size);
  // Reads exactly `size` bytes at `offset` with pread. A short file yields kDataLoss
  // "pread(<path>): wanted N bytes at offset O, file ended after K".
  absl::Status PreadExact(void* data, size_t size, uint64_t offset) const;
  // Size of the file in bytes (fstat).
  absl::StatusOr<uint64_t> Size() const;
  // fsync(2): data and metadata reach stable storage.
  absl::Status Sync();
  // Closes now and reports the close(2) error; later calls are no-ops.
  absl::Status Close();

 private:
  int fd_ = -1;
  std::string path_;
};

// fsyncs the directory `path` so that entries created or renamed in it are durable.
absl::Status SyncDir(const std::string& path);
// fsyncs the regular file `path` (opened read-only).
absl::Status SyncFile(const std::string& path);

// Whole-file read of a regular file (OpenForRead's errors), for small files (manifest, pointer
// file, a tokenizer).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `contents` to `path` atomically: `<path>.tmp` is written and fsynced, renamed over
// `path`, and the parent directory is fsynced. Readers see the old or the new file, never a mix.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// True if `path` exists (any type). Errors other than ENOENT are reported.
absl::StatusOr<bool> PathExists(const std::string& path);
// True if `path` is a directory; kNotFound if it does not exist.
absl::StatusOr<bool> IsDirectory(const std::string& path);
// mkdir(path, 0755); an existing directory is OK.
absl::Status MakeDir(const std::string& path);
// Names in directory `path` (no "." or ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);
// rename(2).
absl::Status Rename(const std::string& from, const std::string& to);
// Removes a file or a directory tree (no symlink following). A missing path is OK.
absl::Status RemoveRecursively(const std::string& path);

// "a" + "/" + "b", without doubling a trailing slash.
std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_FILE_UTIL_H_
