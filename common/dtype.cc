#include "common/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace orthoshard {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kFloat64:
      return "fp64";
    case DType::kInt64:
      return "int64";
    case DType::kInt32:
      return "int32";
    case DType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "fp32" || n == "float32" || n == "float" || n == "f32") return DType::kFloat32;
  if (n == "bf16" || n == "bfloat16") return DType::kBFloat16;
  if (n == "fp16" || n == "float16" || n == "half" || n == "f16") return DType::kFloat16;
  if (n == "fp64" || n == "float64" || n == "double" || n == "f64") return DType::kFloat64;
  if (n == "int64" || n == "i64") return DType::kInt64;
  if (n == "int32" || n == "i32") return DType::kInt32;
  if (n == "uint8" || n == "u8") return DType::kUInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "': expected one of fp32, bf16, fp16, fp64, int64, int32, uint8"));
}

}  // namespace orthoshard
