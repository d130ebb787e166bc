#include "checkpoint/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {

absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path) {
  std::string message = absl::StrCat(op, "(", path, "): ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<File> File::OpenForRead(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer, so fstat can refuse it.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  File file(fd, path);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                    : "not a regular file";
    return absl::InvalidArgumentError(
        absl::StrCat("open(", path, "): ", kind, ", expected a regular file"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoToStatus(errno, "fcntl", path);
  }
  return file;
}

absl::StatusOr<File> File::CreateForWrite(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  return File(fd, path);
}

absl::Status File::WriteAll(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write", path_);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status File::PreadExact(void* data, size_t size, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd_, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "pread", path_);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("pread(", path_, "): wanted ", size,
                                              " bytes at offset ", offset,
                                              ", file ended after ", done));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoToStatus(errno, "fstat", path_);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status File::Sync() {
  if (::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync", path_);
  return absl::OkStatus();
}

absl::Status File::Close() {
  if (fd_ < 0) return absl::OkStatus();
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoToStatus(errno, "close", path_);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  File dir(fd, path);
  return dir.Sync();
}

absl::Status SyncFile(const std::string& path) {
  ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  return file.Sync();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  ASSIGN_OR_RETURN(uint64_t size, file.Size());
  std::string contents(size, '\0');
  RETURN_IF_ERROR(file.PreadExact(contents.data(), contents.size(), 0));
  return contents;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    ASSIGN_OR_RETURN(File file, File::CreateForWrite(tmp));
    RETURN_IF_ERROR(file.WriteAll(contents.data(), contents.size()));
    RETURN_IF_ERROR(file.Sync());
    RETURN_IF_ERROR(file.Close());
  }
  RETURN_IF_ERROR(Rename(tmp, path));
  size_t slash = path.rfind('/');
  return SyncDir(slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash)));
}

absl::StatusOr<bool> PathExists(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoToStatus(errno, "lstat", path);
}

absl::StatusOr<bool> IsDirectory(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat", path);
  return S_ISDIR(st.st_mode);
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return absl::OkStatus();
  int err = errno;
  if (err == EEXIST) {
    ASSIGN_OR_RETURN(bool is_dir, IsDirectory(path));
    if (is_dir) return absl::OkStatus();
  }
  return ErrnoToStatus(err, "mkdir", path);
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoToStatus(errno, "opendir", path);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* entry = ::readdir(dir)) {
    absl::string_view name(entry->d_name);
    if (name != "." && name != "..") names.emplace_back(name);
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return ErrnoToStatus(err, "readdir", path);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename", absl::StrCat(from, " -> ", to));
  }
  return absl::OkStatus();
}

absl::Status RemoveRecursively(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "lstat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
    for (const std::string& name : names) RETURN_IF_ERROR(RemoveRecursively(JoinPath(path, name)));
    if (::rmdir(path.c_str()) != 0) return ErrnoToStatus(errno, "rmdir", path);
    return absl::OkStatus();
  }
  if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink", path);
  return absl::OkStatus();
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace orthoshard::checkpoint
