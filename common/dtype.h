// Element types, as planning code sees them: a name and a size, no LibTorch.
#ifndef ORTHOSHARD_COMMON_DTYPE_H_
#define ORTHOSHARD_COMMON_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard {

enum class DType : uint8_t {
  kFloat32,
  kBFloat16,
  kFloat16,
  kFloat64,
  kInt64,
  kInt32,
  kUInt8,
};

// Bytes per element.
int64_t DTypeSize(DType dtype);

// Short lowercase name: "fp32", "bf16", "fp16", "fp64", "int64", "int32", "uint8".
const char* DTypeName(DType dtype);

// Parses a name as DTypeName prints it; also accepts "float32", "float", "bfloat16", "float16",
// "half", "float64", "double". Returns kInvalidArgument naming the text and the accepted names.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace orthoshard

#endif  // ORTHOSHARD_COMMON_DTYPE_H_
