// Fuzz target for SafetensorsReader (checkpoint/safetensors.h): the input is a whole file, opened
// through a memfd. Open either fails with a status or yields tensors that lie inside the file and
// can all be read back with exactly their byte size.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"

namespace {

using ::orthoshard::checkpoint::SafetensorsReader;
using ::orthoshard::checkpoint::TensorByteSize;
using ::orthoshard::checkpoint::TensorEntry;

// One anonymous in-memory file reused for every input; its /proc path is what Open sees.
int MemFd() {
  static const int fd = memfd_create("safetensors_fuzzer", 0);
  if (fd < 0) std::abort();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = MemFd();
  if (ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::Open(absl::StrCat("/proc/self/fd/", fd));
  if (!reader.ok()) {
    if (reader.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  uint64_t expected_begin = 0;
  for (const TensorEntry& entry : reader->header().tensors) {
    absl::StatusOr<uint64_t> bytes = TensorByteSize(entry.spec);
    if (!bytes.ok() || entry.begin != expected_begin || entry.end - entry.begin != *bytes ||
        reader->data_start() + entry.end > size) {
      std::abort();
    }
    expected_begin = entry.end;
    absl::StatusOr<std::vector<uint8_t>> tensor = reader->ReadTensor(entry.spec.name);
    if (!tensor.ok() || tensor->size() != *bytes) std::abort();
  }
  if (reader->data_start() + expected_begin != size) std::abort();  // no trailing bytes
  return 0;
}
