// A strict, minimal JSON reader and string quoting for the safetensors header and the Hugging Face
// index file. Internal to checkpoint/.
//
// Accepts exactly: objects, arrays, strings (all JSON escapes, \u surrogate pairs → UTF-8) and
// integers (no fraction, exponent or leading zeros; magnitude < 2^64). Rejects true/false/null,
// floating-point numbers, duplicate object keys, nesting deeper than kMaxJsonDepth, arrays longer
// than kMaxJsonArrayLength, documents of more than kMaxJsonValues values (which bounds memory to
// about 150 MB whatever the input) and anything after the top-level value except whitespace.
// Never crashes on any input: every failure is a kInvalidArgument whose message gives the byte
// offset.
#ifndef ORTHOSHARD_CHECKPOINT_INTERNAL_JSON_H_
#define ORTHOSHARD_CHECKPOINT_INTERNAL_JSON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::checkpoint::internal_checkpoint {

inline constexpr int kMaxJsonDepth = 16;
// Shapes and offsets are short; a safetensors header never needs a long array.
inline constexpr size_t kMaxJsonArrayLength = 1024;
// About 7 values per tensor: room for ~150k tensors in one header (a 5 GB Hugging Face shard holds
// a few thousand), at most ~150 MB of parsed values.
inline constexpr size_t kMaxJsonValues = 1 << 20;

struct JsonValue {
  enum class Kind { kObject, kArray, kString, kInteger };
  Kind kind = Kind::kObject;
  // kObject: members in document order (keys are unique).
  std::vector<std::pair<std::string, JsonValue>> members;
  // kArray.
  std::vector<JsonValue> elements;
  // kString.
  std::string string_value;
  // kInteger: magnitude and sign.
  uint64_t magnitude = 0;
  bool negative = false;

  // Member lookup in an object; nullptr if absent or not an object.
  const JsonValue* Find(absl::string_view key) const;
};

// "object", "array", "string" or "integer".
const char* JsonKindName(JsonValue::Kind kind);

// Parses `text` as one JSON value. Errors: kInvalidArgument "JSON error at byte N: ...".
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// `text` as a JSON string literal with quotes; control characters, '"' and '\' escaped.
std::string JsonQuote(absl::string_view text);

}  // namespace orthoshard::checkpoint::internal_checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_INTERNAL_JSON_H_
