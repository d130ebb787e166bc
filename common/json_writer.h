// JSON text built in code, for the files orthoshard writes for other tools (Hugging Face's
// config.json and generation_config.json): a small value tree written as RFC 8259 text.
//
//   JsonNode config = JsonNode::Object();
//   config.Add("model_type", JsonNode::String("llama")).Add("vocab_size", JsonNode::Int(256));
//   ASSIGN_OR_RETURN(std::string text, WriteJson(config));
//
// Objects keep their members in insertion order and are written one member per line (2-space
// indent); arrays of scalars are written on one line. Strings are escaped as RFC 8259 requires
// ('"', '\\' and every control character below U+0020); doubles are written in the shortest form
// that reads back as the same double.
#ifndef ORTHOSHARD_COMMON_JSON_WRITER_H_
#define ORTHOSHARD_COMMON_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard {

// One JSON value: null (the default), a bool, an integer, a double, a string, an array or an object.
class JsonNode {
 public:
  enum class Kind { kNull, kBool, kInt, kDouble, kString, kArray, kObject };

  JsonNode() = default;  // null
  static JsonNode Bool(bool v);
  static JsonNode Int(int64_t v);
  // Must be finite to be written (JSON has no NaN or infinity): WriteJson refuses others.
  static JsonNode Double(double v);
  // Must be UTF-8 to be written: WriteJson refuses other bytes.
  static JsonNode String(absl::string_view v);
  static JsonNode Array(std::vector<JsonNode> elements);
  static JsonNode Object();  // empty

  // Appends member `key` to an object; returns *this for chaining. Precondition: this is an object
  // that has no member `key` yet (checked by WriteJson, which refuses duplicate keys).
  JsonNode& Add(absl::string_view key, JsonNode value);

  Kind kind() const { return kind_; }

 private:
  friend class JsonTextWriter;
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  std::vector<JsonNode> elements_;
  std::vector<std::pair<std::string, JsonNode>> members_;
};

// `value` as JSON text ending in a newline. Errors: kInvalidArgument naming the member's path
// ("rope_parameters.rope_theta") for a non-finite double, a string or key that is not valid UTF-8,
// an object with a key twice, or Add on a non-object.
absl::StatusOr<std::string> WriteJson(const JsonNode& value);

// `utf8` as a JSON string literal with its quotes, escaped as RFC 8259 requires. Precondition:
// valid UTF-8 (WriteJson checks it; this does not).
std::string JsonQuoteUtf8(absl::string_view utf8);

// Whether `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsValidUtf8(absl::string_view bytes);

}  // namespace orthoshard

#endif  // ORTHOSHARD_COMMON_JSON_WRITER_H_
