#include "checkpoint/internal/json.h"

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint::internal_checkpoint {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(JsonTest, ParsesObjectsArraysStringsIntegers) {
  ASSERT_OK_AND_ASSIGN(JsonValue value,
                       ParseJson(" {\"a\": [1, -2, 0, 18446744073709551615], \"b\": {}, "
                                 "\"c\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"} "));
  ASSERT_EQ(value.kind, JsonValue::Kind::kObject);
  ASSERT_EQ(value.members.size(), 3u);
  const JsonValue* a = value.Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->elements.size(), 4u);
  EXPECT_EQ(a->elements[1].magnitude, 2u);
  EXPECT_TRUE(a->elements[1].negative);
  EXPECT_EQ(a->elements[3].magnitude, UINT64_MAX);
  EXPECT_EQ(value.Find("b")->kind, JsonValue::Kind::kObject);
  EXPECT_EQ(value.Find("c")->string_value, "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(value.Find("missing"), nullptr);
}

TEST(JsonTest, RejectsWhatTheFormatDoesNotNeed) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {"", "unexpected end of input"},
           {"{\"a\": true}", "unexpected character 't'"},
           {"{\"a\": null}", "unexpected character 'n'"},
           {"{\"a\": 1.5}", "only integers"},
           {"{\"a\": 1e3}", "only integers"},
           {"{\"a\": 01}", "leading zero"},
           {"{\"a\": 18446744073709551616}", "does not fit in 64 bits"},
           {"{\"a\": -}", "expected a digit"},
           {"{\"a\": 1,}", "expected a string key"},
           {"{\"a\" 1}", "expected ':'"},
           {"{\"a\": 1", "unexpected end of input in an object"},
           {"[1 2]", "expected ',' or ']'"},
           {"{\"a\": 1} x", "unexpected data after the top-level value"},
           {"{\"a\": 1, \"a\": 2}", "duplicate key \"a\""},
           {"\"abc", "unterminated string"},
           {"\"a\\x\"", "invalid escape"},
           {"\"a\\u12G4\"", "invalid hex digit"},
           {"\"\\ud800x\"", "high surrogate not followed"},
           {"\"\\udc00\"", "unpaired low surrogate"},
           {"\"a\nb\"", "unescaped control character"},
           {"[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]", "nesting deeper than 16"},
       }) {
    EXPECT_THAT(ParseJson(c.text), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.text;
  }
}

TEST(JsonTest, BoundsArrayLengthAndValueCount) {
  std::string array = "[0";
  for (size_t i = 1; i < kMaxJsonArrayLength; ++i) array += ",0";
  EXPECT_OK(ParseJson(array + "]"));
  EXPECT_THAT(ParseJson(array + ",0]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("array longer than 1024")));
  std::string object = "{";
  for (size_t i = 0; i <= kMaxJsonValues; ++i) absl::StrAppend(&object, i ? "," : "", "\"", i, "\":0");
  EXPECT_THAT(ParseJson(object + "}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than 1048576 values")));
}

TEST(JsonTest, QuoteRoundTrips) {
  std::string text = "a\"b\\c\n\x01\x1f/\xC3\xA9";
  ASSERT_OK_AND_ASSIGN(JsonValue value, ParseJson(JsonQuote(text)));
  EXPECT_EQ(value.string_value, text);
  EXPECT_EQ(JsonQuote("x\x01"), "\"x\\u0001\"");
}

}  // namespace
}  // namespace orthoshard::checkpoint::internal_checkpoint
