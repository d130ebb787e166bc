#include "common/json_structure.h"

#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CheckJsonStructure, AcceptsOrdinaryJson) {
  EXPECT_OK(CheckJsonStructure(R"({"a": [1, {"b": "x", "c": null}], "d": {"a": true}})", 3));
  // Equal keys in different objects, and string values equal to keys, are fine.
  EXPECT_OK(CheckJsonStructure(R"([{"k": 1}, {"k": 2}, {"v": "k", "w": "k"}])", 2));
  EXPECT_OK(CheckJsonStructure(R"("{[ not structure ]}")", 1));
  EXPECT_OK(CheckJsonStructure("", 1));
}

TEST(CheckJsonStructure, RefusesNestingPastTheLimit) {
  EXPECT_OK(CheckJsonStructure("[[[]]]", 3));
  EXPECT_THAT(CheckJsonStructure("[[[[]]]]", 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("JSON nests deeper than 3 levels at byte 3")));
  EXPECT_THAT(CheckJsonStructure(R"({"a": {"b": {"c": 1}}})", 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("JSON nests deeper than 2 levels at byte 12")));
}

// 400 kB of nested arrays (protobuf's JSON parser alone takes half an hour or more): refused at the limit, after
// reading the first max_depth + 1 bytes. The test's timeout catches a scan that is not linear.
TEST(CheckJsonStructure, RefusesADeeplyNestedFileAtOnce) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_THAT(CheckJsonStructure(deep, 32),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("JSON nests deeper than 32 levels at byte 32")));
  // Unclosed, and brackets inside strings, are scanned in one pass too.
  std::string strings;
  for (int i = 0; i < 100000; ++i) strings += "\"[\",";
  EXPECT_OK(CheckJsonStructure("[" + strings + "1]", 1));
}

TEST(CheckJsonStructure, RefusesADuplicateKeyNamingIt) {
  EXPECT_THAT(CheckJsonStructure(R"({"vocab_size": 1, "eod_token": 0, "vocab_size": 2})", 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("JSON object has the key \"vocab_size\" twice (byte 34)")));
  // Escapes are decoded before comparing: "\u0061" is "a", and a surrogate pair is one code point.
  EXPECT_THAT(CheckJsonStructure(R"({"a": 1, "\u0061": 2})", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key \"a\" twice")));
  EXPECT_THAT(CheckJsonStructure("{\"\\ud83d\\ude00\": 1, \"\xF0\x9F\x98\x80\": 2}", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(CheckJsonStructure(R"({"x": {"a": 1, "b": [{"a": 1}], "a": 3}})", 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key \"a\" twice")));
  EXPECT_OK(CheckJsonStructure(R"({"a\"b": 1, "a\\b": 2, "\"ab": 3})", 1));
}

}  // namespace
}  // namespace orthoshard
