#include "common/exact_sum.h"

#include <cassert>
#include <cmath>
#include <cstring>

namespace orthoshard {
namespace {

constexpr int64_t kDigit = int64_t{1} << 32;
// Normalize before a limb could leave int64: each addition adds less than 2^32 to a limb.
constexpr int64_t kMaxPending = int64_t{1} << 30;

}  // namespace

void ExactFloatSum::Add(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const int biased = static_cast<int>((bits >> 23) & 0xff);
  if (biased == 0xff) {
    assert(false && "ExactFloatSum: a value is not finite");
    return;
  }
  // value = mantissa * 2^(shift - 149), shift in [0, 253].
  const int64_t mantissa =
      biased == 0 ? int64_t{bits & 0x7fffff} : int64_t{(bits & 0x7fffff) | 0x800000};
  if (mantissa == 0) return;
  const int shift = biased == 0 ? 0 : biased - 1;
  const int limb = shift / 32;
  const uint64_t shifted = static_cast<uint64_t>(mantissa) << (shift % 32);  // < 2^55
  const int64_t low = static_cast<int64_t>(shifted & 0xffffffffu);
  const int64_t high = static_cast<int64_t>(shifted >> 32);
  const bool negative = (bits >> 31) != 0;
  limbs_[limb] += negative ? -low : low;
  limbs_[limb + 1] += negative ? -high : high;
  if (++pending_ >= kMaxPending) Normalize();
}

void ExactFloatSum::Add(absl::Span<const float> values) {
  for (float v : values) Add(v);
}

void ExactFloatSum::Merge(const Limbs& limbs) {
  // Both sides below 2^32 per digit, then digit by digit.
  ExactFloatSum other;
  other.limbs_ = limbs;
  other.Normalize();
  Normalize();
  for (int i = 0; i < kLimbs; ++i) limbs_[i] += other.limbs_[i];
  Normalize();
}

void ExactFloatSum::Normalize() {
  for (int i = 0; i + 1 < kLimbs; ++i) {
    // Floor division by 2^32, so that the remainder is in [0, 2^32).
    int64_t carry = limbs_[i] / kDigit;
    if (limbs_[i] - carry * kDigit < 0) --carry;
    limbs_[i] -= carry * kDigit;
    limbs_[i + 1] += carry;
  }
  pending_ = 0;
}

ExactFloatSum::Limbs ExactFloatSum::limbs() const {
  ExactFloatSum copy = *this;
  copy.Normalize();
  return copy.limbs_;
}

double ExactFloatSum::ToDouble() const {
  const Limbs l = limbs();
  double value = 0.0;
  for (int i = kLimbs - 1; i >= 0; --i) value = value * static_cast<double>(kDigit) + l[i];
  return std::ldexp(value, -149);
}

}  // namespace orthoshard
