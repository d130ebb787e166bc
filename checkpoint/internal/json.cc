#include "checkpoint/internal/json.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace orthoshard::checkpoint::internal_checkpoint {
namespace {

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    if (absl::Status s = ParseValue(0, value); !s.ok()) return s;
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected data after the top-level value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON error at byte ", pos_, ": ", what));
  }

  void SkipWhitespace() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  absl::Status ParseValue(int depth, JsonValue& out) {
    if (++values_ > kMaxJsonValues) {
      return Error(absl::StrCat("more than ", kMaxJsonValues, " values in the document"));
    }
    SkipWhitespace();
    if (pos_ >= text_.size()) return Error("unexpected end of input, expected a value");
    char c = text_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= kMaxJsonDepth) {
        return Error(absl::StrCat("nesting deeper than ", kMaxJsonDepth, " levels"));
      }
      return c == '{' ? ParseObject(depth + 1, out) : ParseArray(depth + 1, out);
    }
    if (c == '"') {
      out.kind = JsonValue::Kind::kString;
      return ParseString(out.string_value);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseInteger(out);
    return Error(absl::StrFormat("unexpected character '%s' (only objects, arrays, strings and "
                                 "integers are allowed)",
                                 absl::CHexEscape(text_.substr(pos_, 1))));
  }

  absl::Status ParseObject(int depth, JsonValue& out) {
    out.kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    absl::flat_hash_set<std::string> keys;
    while (true) {
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a string key");
      std::string key;
      if (absl::Status s = ParseString(key); !s.ok()) return s;
      if (!keys.insert(key).second) {
        return Error(absl::StrCat("duplicate key \"", absl::CHexEscape(key), "\""));
      }
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return Error("expected ':' after a key");
      ++pos_;
      out.members.emplace_back(std::move(key), JsonValue());
      if (absl::Status s = ParseValue(depth, out.members.back().second); !s.ok()) return s;
      SkipWhitespace();
      if (pos_ >= text_.size()) return Error("unexpected end of input in an object");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::Status ParseArray(int depth, JsonValue& out) {
    out.kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      if (out.elements.size() >= kMaxJsonArrayLength) {
        return Error(absl::StrCat("array longer than ", kMaxJsonArrayLength, " elements"));
      }
      out.elements.emplace_back();
      if (absl::Status s = ParseValue(depth, out.elements.back()); !s.ok()) return s;
      SkipWhitespace();
      if (pos_ >= text_.size()) return Error("unexpected end of input in an array");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in an array");
    }
  }

  absl::Status ParseHex4(uint32_t& out) {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return Error("invalid hex digit in \\u escape");
      }
      out = out * 16 + digit;
    }
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseString(std::string& out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (static_cast<unsigned char>(c) < 0x20) return Error("unescaped control character in string");
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("unterminated escape in string");
      char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status s = ParseHex4(cp); !s.ok()) return s;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
              return Error("high surrogate not followed by a \\u low surrogate");
            }
            pos_ += 2;
            uint32_t low = 0;
            if (absl::Status s = ParseHex4(low); !s.ok()) return s;
            if (low < 0xDC00 || low > 0xDFFF) return Error("invalid low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error(absl::StrCat("invalid escape '\\", absl::CHexEscape(absl::string_view(&e, 1)),
                                    "' in string"));
      }
    }
  }

  absl::Status ParseInteger(JsonValue& out) {
    out.kind = JsonValue::Kind::kInteger;
    if (text_[pos_] == '-') {
      out.negative = true;
      ++pos_;
    }
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
      return Error("expected a digit");
    }
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return Error("leading zero in integer");
    }
    uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (value > (UINT64_MAX - digit) / 10) return Error("integer does not fit in 64 bits");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return Error("only integers are allowed, not fractions or exponents");
    }
    out.magnitude = value;
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
  size_t values_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& member : members) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

const char* JsonKindName(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::kObject: return "object";
    case JsonValue::Kind::kArray: return "array";
    case JsonValue::Kind::kString: return "string";
    case JsonValue::Kind::kInteger: return "integer";
  }
  return "unknown";
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<int>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace orthoshard::checkpoint::internal_checkpoint
