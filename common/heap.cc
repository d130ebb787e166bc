#include "common/heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"

namespace orthoshard {

absl::Status RetainFreedHeapMemory() {
#if defined(__GLIBC__)
  // mallopt returns 1 on success, 0 on a value it refuses.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMaxHeapBlockBytes)) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RetainFreedHeapMemory: glibc refused M_MMAP_THRESHOLD = ", kMaxHeapBlockBytes));
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimBytes)) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("RetainFreedHeapMemory: glibc refused M_TRIM_THRESHOLD = ", kTrimBytes));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "RetainFreedHeapMemory: needs glibc's malloc (mallopt); this C library is not glibc");
#endif
}

}  // namespace orthoshard
