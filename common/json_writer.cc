#include "common/json_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace orthoshard {

JsonNode JsonNode::Bool(bool v) {
  JsonNode n;
  n.kind_ = Kind::kBool;
  n.bool_ = v;
  return n;
}

JsonNode JsonNode::Int(int64_t v) {
  JsonNode n;
  n.kind_ = Kind::kInt;
  n.int_ = v;
  return n;
}

JsonNode JsonNode::Double(double v) {
  JsonNode n;
  n.kind_ = Kind::kDouble;
  n.double_ = v;
  return n;
}

JsonNode JsonNode::String(absl::string_view v) {
  JsonNode n;
  n.kind_ = Kind::kString;
  n.string_ = std::string(v);
  return n;
}

JsonNode JsonNode::Array(std::vector<JsonNode> elements) {
  JsonNode n;
  n.kind_ = Kind::kArray;
  n.elements_ = std::move(elements);
  return n;
}

JsonNode JsonNode::Object() {
  JsonNode n;
  n.kind_ = Kind::kObject;
  return n;
}

JsonNode& JsonNode::Add(absl::string_view key, JsonNode value) {
  members_.emplace_back(std::string(key), std::move(value));
  return *this;
}

bool IsValidUtf8(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // RFC 3629 section 4: the lead byte fixes the length and the range of the second byte.
    int length;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) {
      length = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      length = 3;
      if (b == 0xe0) lo = 0xa0;  // overlong
      if (b == 0xed) hi = 0x9f;  // surrogates
    } else if (b >= 0xf0 && b <= 0xf4) {
      length = 4;
      if (b == 0xf0) lo = 0x90;  // overlong
      if (b == 0xf4) hi = 0x8f;  // past U+10FFFF
    } else {
      return false;
    }
    if (bytes.size() - i < static_cast<size_t>(length)) return false;
    for (int k = 1; k < length; ++k) {
      const uint8_t c = static_cast<uint8_t>(bytes[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return false;
    }
    i += length;
  }
  return true;
}

std::string JsonQuoteUtf8(absl::string_view utf8) {
  std::string out = "\"";
  for (const char ch : utf8) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<uint8_t>(ch) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<uint8_t>(ch));
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

namespace {

// An integral value below 2^53 as "10000.0" (a float to readers that tell them apart); any other
// as the shortest of %.1g .. %.17g that reads back as `v` (17 significant digits always do).
std::string ShortestDouble(double v) {
  if (std::trunc(v) == v && std::fabs(v) < 9007199254740992.0) return absl::StrFormat("%.1f", v);
  for (int digits = 1; digits < 17; ++digits) {
    const std::string s = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

bool IsScalar(const JsonNode& n) {
  return n.kind() != JsonNode::Kind::kArray && n.kind() != JsonNode::Kind::kObject;
}

}  // namespace

class JsonTextWriter {
 public:
  absl::Status Write(const JsonNode& n, const std::string& path, int indent) {
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("JSON value ", path.empty() ? "(top level)" : path, ": ", what));
    };
    if (n.kind_ != JsonNode::Kind::kObject && !n.members_.empty()) {
      return error("has members but is not an object");
    }
    switch (n.kind_) {
      case JsonNode::Kind::kNull: out_ += "null"; break;
      case JsonNode::Kind::kBool: out_ += n.bool_ ? "true" : "false"; break;
      case JsonNode::Kind::kInt: absl::StrAppend(&out_, n.int_); break;
      case JsonNode::Kind::kDouble:
        if (!std::isfinite(n.double_)) return error(absl::StrCat("non-finite number ", n.double_));
        out_ += ShortestDouble(n.double_);
        break;
      case JsonNode::Kind::kString:
        if (!IsValidUtf8(n.string_)) return error("string is not valid UTF-8");
        out_ += JsonQuoteUtf8(n.string_);
        break;
      case JsonNode::Kind::kArray: {
        const bool inline_array =
            std::all_of(n.elements_.begin(), n.elements_.end(), IsScalar);
        out_ += '[';
        for (size_t i = 0; i < n.elements_.size(); ++i) {
          if (i > 0) out_ += inline_array ? ", " : ",";
          if (!inline_array) NewLine(indent + 1);
          RETURN_IF_ERROR(Write(n.elements_[i], absl::StrCat(path, "[", i, "]"), indent + 1));
        }
        if (!inline_array && !n.elements_.empty()) NewLine(indent);
        out_ += ']';
        break;
      }
      case JsonNode::Kind::kObject: {
        std::set<absl::string_view> keys;
        out_ += '{';
        for (size_t i = 0; i < n.members_.size(); ++i) {
          const auto& [key, value] = n.members_[i];
          const std::string member = path.empty() ? key : absl::StrCat(path, ".", key);
          if (!IsValidUtf8(key)) return error("a key is not valid UTF-8");
          if (!keys.insert(key).second) return error(absl::StrCat("key \"", key, "\" twice"));
          if (i > 0) out_ += ',';
          NewLine(indent + 1);
          absl::StrAppend(&out_, JsonQuoteUtf8(key), ": ");
          RETURN_IF_ERROR(Write(value, member, indent + 1));
        }
        if (!n.members_.empty()) NewLine(indent);
        out_ += '}';
        break;
      }
    }
    return absl::OkStatus();
  }

  std::string Take() { return std::move(out_); }

 private:
  void NewLine(int indent) {
    out_ += '\n';
    out_.append(2 * indent, ' ');
  }

  std::string out_;
};

absl::StatusOr<std::string> WriteJson(const JsonNode& value) {
  JsonTextWriter writer;
  RETURN_IF_ERROR(writer.Write(value, "", 0));
  return writer.Take() + "\n";
}

}  // namespace orthoshard
