#include "common/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace orthoshard {
namespace {

// Values over the whole fp32 range (subnormals to 2^100), both signs.
std::vector<float> WideValues(int n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> exponent(-149, 100);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::vector<float> values;
  for (int i = 0; i < n; ++i) {
    const float v = std::ldexp(mantissa(gen), exponent(gen));
    values.push_back(gen() % 2 ? v : -v);
  }
  return values;
}

TEST(ExactFloatSum, AnyOrderAndSplitGivesTheSameLimbsAndDouble) {
  std::vector<float> values = WideValues(20000, 7);
  ExactFloatSum whole;
  whole.Add(values);
  std::shuffle(values.begin(), values.end(), std::mt19937(11));
  // Three partial sums merged in another order, as ranks holding shards would.
  ExactFloatSum parts[3];
  for (size_t i = 0; i < values.size(); ++i) parts[i % 3].Add(values[i]);
  ExactFloatSum merged;
  merged.Merge(parts[2].limbs());
  merged.Merge(parts[0].limbs());
  merged.Merge(parts[1].limbs());
  EXPECT_EQ(merged.limbs(), whole.limbs());
  EXPECT_EQ(merged.ToDouble(), whole.ToDouble());
}

TEST(ExactFloatSum, IsExactWhereFloatingPointSumsAreNot) {
  ExactFloatSum s;
  s.Add({1e30f, 1.0f, -1e30f});  // a double sum in this order gives 0
  EXPECT_EQ(s.ToDouble(), 1.0);
  ExactFloatSum tiny;
  const float denorm_min = std::numeric_limits<float>::denorm_min();  // 2^-149
  tiny.Add({denorm_min, denorm_min, denorm_min});
  EXPECT_EQ(tiny.ToDouble(), std::ldexp(3.0, -149));
  ExactFloatSum huge;
  huge.Add({std::numeric_limits<float>::max(), std::numeric_limits<float>::max()});
  EXPECT_EQ(huge.ToDouble(), 2.0 * static_cast<double>(std::numeric_limits<float>::max()));
  ExactFloatSum integers;
  for (int i = 1; i <= 1000; ++i) integers.Add(static_cast<float>(i));
  EXPECT_EQ(integers.ToDouble(), 500500.0);
  ExactFloatSum negative;
  negative.Add({-5.5f, 0.25f, -0.25f});
  EXPECT_EQ(negative.ToDouble(), -5.5);
}

TEST(ExactFloatSum, CancellationLeavesExactlyZero) {
  const std::vector<float> values = WideValues(5000, 3);
  ExactFloatSum s;
  s.Add(values);
  for (float v : values) s.Add(-v);
  EXPECT_EQ(s.limbs(), ExactFloatSum::Limbs{});
  EXPECT_EQ(s.ToDouble(), 0.0);
  EXPECT_FALSE(std::signbit(s.ToDouble()));
}

// The rounding to double is within a few ulps of the exact value (here compared with a long double
// sum, whose 64-bit mantissa rounds about 2^11 times finer than a double).
TEST(ExactFloatSum, DoubleIsCloseToTheExactValue) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  ExactFloatSum s;
  long double reference = 0;
  for (int i = 0; i < 100000; ++i) {
    const float v = value(gen);
    s.Add(v);
    reference += v;
  }
  EXPECT_NEAR(
      s.ToDouble(), static_cast<double>(reference),
      4 * std::abs(static_cast<double>(reference)) * std::numeric_limits<double>::epsilon());
}

}  // namespace
}  // namespace orthoshard
