// Fuzz target for the checkpoint JSON reader (checkpoint/internal/json.h): any input either parses
// or is rejected with kInvalidArgument; a parsed string survives JsonQuote → ParseJson unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/internal/json.h"

namespace {

using ::orthoshard::checkpoint::internal_checkpoint::JsonQuote;
using ::orthoshard::checkpoint::internal_checkpoint::JsonValue;
using ::orthoshard::checkpoint::internal_checkpoint::ParseJson;

// Re-quotes every string (and object key) and checks it parses back to itself.
void CheckQuoteRoundTrip(const JsonValue& value) {
  auto check = [](const std::string& text) {
    absl::StatusOr<JsonValue> again = ParseJson(JsonQuote(text));
    if (!again.ok() || again->kind != JsonValue::Kind::kString || again->string_value != text) {
      std::abort();
    }
  };
  switch (value.kind) {
    case JsonValue::Kind::kString:
      check(value.string_value);
      break;
    case JsonValue::Kind::kObject:
      for (const auto& [key, member] : value.members) {
        check(key);
        CheckQuoteRoundTrip(member);
      }
      break;
    case JsonValue::Kind::kArray:
      for (const JsonValue& element : value.elements) CheckQuoteRoundTrip(element);
      break;
    case JsonValue::Kind::kInteger:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<JsonValue> value =
      ParseJson(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!value.ok()) {
    if (value.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  CheckQuoteRoundTrip(*value);
  return 0;
}
