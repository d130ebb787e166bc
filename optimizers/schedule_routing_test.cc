// Tests for the pure planning parts: lr schedules and optimizer routing.
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/routing.h"
#include "optimizers/schedule.h"

namespace orthoshard::optimizers {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

// LrMultiplier is compared with EXPECT_DOUBLE_EQ (within 4 ulps): each expectation is the
// schedule's formula written another way (0.9 for 1 - 0.1, 0.1 + 0.9 * 0.5 for the halfway
// cosine, 1.0 / 3 for (0 + 1) / 3), so the two sides place at most 3 roundings differently, each
// of an intermediate no larger than ~2x the result in [0, 1] (<= 1 ulp of it); the cosine is the
// same std::cos of the same argument on both sides (pi * 0.25 is exact in both).

TEST(ScheduleTest, WarmupThenCosine) {
  ScheduleConfig c{ScheduleKind::kWarmupCosine, /*warmup_steps=*/4, /*total_steps=*/12,
                   /*decay_steps=*/0, /*min_lr_ratio=*/0.1};
  ASSERT_TRUE(ValidateSchedule(c).ok());
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 4), 1.0);
  // Halfway through the decay: floor + (1 - floor) / 2.
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 8), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 6), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)));
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 12), 0.1);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 100), 0.1);
}

TEST(ScheduleTest, WarmupThenLinear) {
  ScheduleConfig c{ScheduleKind::kWarmupLinear, 2, 10, 0, 0.0};
  ASSERT_TRUE(ValidateSchedule(c).ok());
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 0), 0.5);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 2), 1.0);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 6), 0.5);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 10), 0.0);
}

TEST(ScheduleTest, WarmupStableDecay) {
  ScheduleConfig c{ScheduleKind::kWsd, 2, 10, /*decay_steps=*/4, /*min_lr_ratio=*/0.2};
  ASSERT_TRUE(ValidateSchedule(c).ok());
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 1), 1.0);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 5), 1.0);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 6), 1.0);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 8), 0.6);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 10), 0.2);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 11), 0.2);
}

TEST(ScheduleTest, ConstantWithWarmup) {
  ScheduleConfig c{ScheduleKind::kConstant, 3, 0, 0, 0.0};
  ASSERT_TRUE(ValidateSchedule(c).ok());
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 0), 1.0 / 3);
  EXPECT_DOUBLE_EQ(LrMultiplier(c, 1000), 1.0);
}

TEST(ScheduleTest, InvalidConfigs) {
  EXPECT_THAT(ValidateSchedule({ScheduleKind::kWarmupCosine, 10, 5, 0, 0.0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("warmup_steps 10 exceeds total_steps 5")));
  EXPECT_THAT(ValidateSchedule({ScheduleKind::kWarmupLinear, 0, 0, 0, 0.0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("total_steps must be > 0, got 0")));
  EXPECT_THAT(ValidateSchedule({ScheduleKind::kWsd, 2, 10, 9, 0.0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("decay_steps must be in [1, total_steps - warmup_steps = 8], got 9")));
  EXPECT_THAT(ValidateSchedule({ScheduleKind::kConstant, 0, 0, 0, 1.5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("min_lr_ratio must be in [0, 1], got 1.5")));
  EXPECT_THAT(ValidateSchedule({ScheduleKind::kConstant, -1, 0, 0, 0.0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("warmup_steps must be >= 0, got -1")));
}

TEST(GlobTest, Matches) {
  EXPECT_TRUE(GlobMatch("*embed*", "model.embed_tokens.weight"));
  EXPECT_TRUE(GlobMatch("layers.*.fc1.weight", "layers.12.fc1.weight"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("a*b*c", "abxbc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "abxbd"));
  EXPECT_FALSE(GlobMatch("fc1", "fc1.weight"));
}

std::vector<ParamDescriptor> ToyModel() {
  return {
      {"embed.weight", {100, 16}},              // embedding: adamw by name
      {"layers.0.norm.weight", {16}},           // 1-D: adamw
      {"layers.0.qkv.weight", {48, 16}},        // hidden: muon
      {"layers.0.qkv.bias", {48}},              // 1-D: adamw
      {"layers.0.fc1.weight", {64, 16}},        // hidden: muon
      {"layers.0.fc2.weight", {16, 32}},        // hidden: muon
      {"output_layer.weight", {100, 16}},       // head: adamw by name
      {"router.scale", {}},                     // scalar: adamw
  };
}

TEST(RoutingTest, DefaultRulesAndReport) {
  auto report = PlanRouting(RoutingConfig{}, ToyModel());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->muon_count, 3);
  EXPECT_EQ(report->muon_numel, 48 * 16 + 64 * 16 + 16 * 32);
  EXPECT_EQ(report->adamw_count, 5);
  EXPECT_EQ(report->adamw_numel, 1600 + 16 + 48 + 1600 + 1);
  EXPECT_EQ(report->entries[0].route, Route::kAdamW);
  EXPECT_EQ(report->entries[0].reason, "name matches '*embed*'");
  EXPECT_EQ(report->entries[1].reason, "1-D, not a matrix");
  EXPECT_EQ(report->entries[2].route, Route::kMuon);
  EXPECT_EQ(report->entries[2].reason, "2-D hidden matrix");
  EXPECT_EQ(report->entries[6].reason, "name matches '*output_layer*'");
  EXPECT_EQ(report->entries[7].reason, "0-D, not a matrix");
  const std::string text = report->ToString();
  EXPECT_THAT(text, HasSubstr("optimizer routing: muon 3 params / 2304 elements, adamw 5 params / "
                              "3265 elements\n"));
  EXPECT_THAT(text, HasSubstr("  layers.0.qkv.weight (768) -> muon (2-D hidden matrix)\n"));
}

TEST(RoutingTest, OverridesWinInOrder) {
  RoutingConfig config;
  config.overrides = {{"layers.0.fc2.*", Route::kAdamW}, {"*.fc*", Route::kMuon}};
  auto report = PlanRouting(config, ToyModel());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->entries[5].route, Route::kAdamW);
  EXPECT_EQ(report->entries[5].reason, "override 'layers.0.fc2.*'");
  EXPECT_EQ(report->entries[4].route, Route::kMuon);
  EXPECT_EQ(report->entries[4].reason, "override '*.fc*'");
  EXPECT_EQ(report->muon_count, 2);
}

TEST(RoutingTest, Errors) {
  RoutingConfig config;
  config.overrides = {{"*.bias", Route::kMuon}};
  EXPECT_THAT(PlanRouting(config, ToyModel()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'layers.0.qkv.bias': override '*.bias' routes it to muon, "
                                 "which needs a 2-D matrix, got shape [48]")));
  std::vector<ParamDescriptor> dup = {{"w", {2, 2}}, {"w", {2, 2}}};
  EXPECT_THAT(PlanRouting(RoutingConfig{}, dup),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate param name 'w'")));
}

}  // namespace
}  // namespace orthoshard::optimizers
