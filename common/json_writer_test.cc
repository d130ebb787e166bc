#include "common/json_writer.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(WriteJson, LayoutOfObjectsArraysAndScalars) {
  JsonNode rope = JsonNode::Object();
  rope.Add("rope_type", JsonNode::String("default")).Add("rope_theta", JsonNode::Double(10000));
  JsonNode config = JsonNode::Object();
  config.Add("architectures", JsonNode::Array({JsonNode::String("LlamaForCausalLM")}))
      .Add("vocab_size", JsonNode::Int(-32001))
      .Add("rms_norm_eps", JsonNode::Double(1e-5))
      .Add("tie", JsonNode::Bool(false))
      .Add("eos_token_id", JsonNode())
      .Add("rope_parameters", std::move(rope))
      .Add("empty", JsonNode::Object())
      .Add("none", JsonNode::Array({}))
      .Add("nested", JsonNode::Array({JsonNode::Object(), JsonNode::Int(1)}));
  ASSERT_OK_AND_ASSIGN(const std::string text, WriteJson(config));
  EXPECT_EQ(text,
            "{\n"
            "  \"architectures\": [\"LlamaForCausalLM\"],\n"
            "  \"vocab_size\": -32001,\n"
            "  \"rms_norm_eps\": 1e-05,\n"
            "  \"tie\": false,\n"
            "  \"eos_token_id\": null,\n"
            "  \"rope_parameters\": {\n"
            "    \"rope_type\": \"default\",\n"
            "    \"rope_theta\": 10000.0\n"
            "  },\n"
            "  \"empty\": {},\n"
            "  \"none\": [],\n"
            "  \"nested\": [\n"
            "    {},\n"
            "    1\n"
            "  ]\n"
            "}\n");
}

TEST(JsonQuoteUtf8, EscapesWhatRfc8259Requires) {
  std::string all_controls;
  for (int c = 0; c < 0x20; ++c) all_controls += static_cast<char>(c);
  const std::string quoted = JsonQuoteUtf8(all_controls);
  EXPECT_EQ(quoted.substr(0, 8), "\"\\u0000\\");
  EXPECT_THAT(quoted, HasSubstr("\\b\\t\\n\\u000b\\f\\r\\u000e"));
  EXPECT_THAT(quoted, HasSubstr("\\u001f\""));
  for (char c : quoted.substr(1, quoted.size() - 2)) EXPECT_GE(static_cast<uint8_t>(c), 0x20);
  EXPECT_EQ(JsonQuoteUtf8("a\"b\\c/d\x7f"), "\"a\\\"b\\\\c/d\x7f\"");
  EXPECT_EQ(JsonQuoteUtf8("<|endoftext|> \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
            "\"<|endoftext|> \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
}

TEST(IsValidUtf8, AcceptsUtf8AndRefusesEverythingElse) {
  for (const char* ok : {"", "ascii", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf",
                         "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(IsValidUtf8(ok)) << ok;
  }
  for (const char* bad : {"\x80", "\xbf", "\xc0\x80", "\xc1\xbf",  // continuation, overlong 2
                          "\xe0\x80\x80", "\xe0\x9f\xbf",           // overlong 3
                          "\xed\xa0\x80", "\xed\xbf\xbf",           // surrogates
                          "\xf0\x80\x80\x80", "\xf0\x8f\xbf\xbf",   // overlong 4
                          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",   // past U+10FFFF
                          "\xff", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xc3\x28"}) {
    EXPECT_FALSE(IsValidUtf8(bad)) << ::testing::PrintToString(std::string(bad));
  }
}

// Every double is written in a form strtod reads back bitwise (shortest of %.1g..%.17g).
TEST(WriteJson, DoublesRoundTrip) {
  std::mt19937_64 rng(7);
  std::vector<double> values = {0.0, -0.0, 1.0, 0.1, 1e-5, 1e-6, 0.02, 500000.0, 1e300, -3.5e-310,
                                std::numeric_limits<double>::max(),
                                std::numeric_limits<double>::min(),
                                std::numeric_limits<double>::denorm_min()};
  for (int i = 0; i < 20000; ++i) {
    const uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    if (std::isfinite(v)) values.push_back(v);
  }
  for (const double v : values) {
    ASSERT_OK_AND_ASSIGN(std::string text, WriteJson(JsonNode::Double(v)));
    const double back = std::strtod(text.c_str(), nullptr);
    EXPECT_EQ(std::memcmp(&back, &v, sizeof(v)), 0) << text;
    EXPECT_EQ(text.find_first_not_of("0123456789.-+e\n"), std::string::npos) << text;
  }
  ASSERT_OK_AND_ASSIGN(std::string short_text, WriteJson(JsonNode::Double(0.1)));
  EXPECT_EQ(short_text, "0.1\n");
}

TEST(WriteJson, RefusesWhatIsNotJsonNamingTheMember) {
  JsonNode nan = JsonNode::Object();
  JsonNode inner = JsonNode::Object();
  inner.Add("rope_theta", JsonNode::Double(std::nan("")));
  nan.Add("rope_parameters", std::move(inner));
  EXPECT_THAT(WriteJson(nan), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("rope_parameters.rope_theta: non-finite")));
  EXPECT_THAT(WriteJson(JsonNode::Array({JsonNode::Double(INFINITY)})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0]: non-finite")));
  JsonNode bad_string = JsonNode::Object();
  bad_string.Add("name", JsonNode::String("\xff"));
  EXPECT_THAT(WriteJson(bad_string), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("name: string is not valid UTF-8")));
  JsonNode bad_key = JsonNode::Object();
  bad_key.Add("\xc0\x80", JsonNode());
  EXPECT_THAT(WriteJson(bad_key),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key is not valid UTF-8")));
  JsonNode twice = JsonNode::Object();
  twice.Add("a", JsonNode::Int(1)).Add("a", JsonNode::Int(2));
  EXPECT_THAT(WriteJson(twice),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key \"a\" twice")));
  JsonNode not_object = JsonNode::Int(1);
  not_object.Add("a", JsonNode());
  EXPECT_THAT(WriteJson(not_object), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("has members but is not an object")));
}

}  // namespace
}  // namespace orthoshard
