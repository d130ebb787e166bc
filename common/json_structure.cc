#include "common/json_structure.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace orthoshard {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The four hex digits at text[i..i+4) as a code unit, or -1.
int32_t HexUnit(absl::string_view text, size_t i) {
  if (i + 4 > text.size()) return -1;
  int32_t unit = 0;
  for (size_t k = i; k < i + 4; ++k) {
    const int digit = HexDigit(text[k]);
    if (digit < 0) return -1;
    unit = unit * 16 + digit;
  }
  return unit;
}

void AppendUtf8(uint32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

// Reads the string literal whose opening quote is at text[*i]; leaves *i after the closing quote
// (or at the end of a text that has none) and puts its decoded value in `value`. A malformed escape
// is kept as written (the full parser refuses it).
void ReadString(absl::string_view text, size_t* i, std::string* value) {
  value->clear();
  size_t k = *i + 1;
  while (k < text.size() && text[k] != '"') {
    if (text[k] != '\\' || k + 1 >= text.size()) {
      value->push_back(text[k++]);
      continue;
    }
    const char e = text[k + 1];
    static constexpr absl::string_view kFrom = "\"\\/bfnrt", kTo = "\"\\/\b\f\n\r\t";
    if (const size_t at = kFrom.find(e); at != absl::string_view::npos) {
      value->push_back(kTo[at]);
      k += 2;
      continue;
    }
    int32_t unit = e == 'u' ? HexUnit(text, k + 2) : -1;
    if (unit < 0) {
      value->push_back(text[k++]);
      continue;
    }
    k += 6;
    if (unit >= 0xD800 && unit < 0xDC00 && k + 1 < text.size() && text[k] == '\\' &&
        text[k + 1] == 'u') {
      const int32_t low = HexUnit(text, k + 2);
      if (low >= 0xDC00 && low < 0xE000) {
        unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
        k += 6;
      }
    }
    AppendUtf8(static_cast<uint32_t>(unit), value);
  }
  *i = k < text.size() ? k + 1 : k;
}

// One open object or array.
struct Open {
  bool is_object;
  bool expect_key;  // objects: the next string is a key (after '{' or ',')
  absl::flat_hash_set<std::string> keys;
};

}  // namespace

absl::Status CheckJsonStructure(absl::string_view text, int max_depth) {
  std::vector<Open> open;
  std::string value;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      const size_t start = i;
      ReadString(text, &i, &value);
      if (!open.empty() && open.back().is_object && open.back().expect_key) {
        open.back().expect_key = false;
        if (!open.back().keys.insert(value).second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "JSON object has the key \"", value, "\" twice (byte ", start, ")"));
        }
      }
      continue;
    }
    if (c == '{' || c == '[') {
      if (static_cast<int>(open.size()) >= max_depth) {
        return absl::InvalidArgumentError(
            absl::StrCat("JSON nests deeper than ", max_depth, " levels at byte ", i));
      }
      open.push_back({c == '{', c == '{', {}});
    } else if ((c == '}' || c == ']') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back().is_object) {
      open.back().expect_key = true;
    }
    ++i;
  }
  return absl::OkStatus();
}

}  // namespace orthoshard
