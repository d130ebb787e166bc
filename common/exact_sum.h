// An exact, order-independent sum of float values, for checksums that must not depend on how
// values are split across ranks or buffers (a param checksum at dp 2 equals the one at dp 1 when
// the params are bitwise equal, whatever the layout).
//
// Every finite fp32 value is m * 2^e with an integer |m| < 2^24 and e >= -149, so it is an integer
// multiple of 2^-149 below 2^128 in magnitude. The accumulator is a fixed-point number with that
// unit, in 32-bit digits held in int64 limbs (room for the carries of 2^30 additions between
// normalisations): 10 digits cover 320 bits, enough for the sum of 2^40 values of any magnitude.
// Sums are exact, so partial sums combine in any order and grouping to the same value (Merge, or
// adding Limbs() across ranks with an integer all-reduce: normalized limbs are below 2^32, so up to
// 2^31 ranks add without overflow).
#ifndef ORTHOSHARD_COMMON_EXACT_SUM_H_
#define ORTHOSHARD_COMMON_EXACT_SUM_H_

#include <array>
#include <cstdint>

#include "absl/types/span.h"

namespace orthoshard {

class ExactFloatSum {
 public:
  static constexpr int kLimbs = 10;
  using Limbs = std::array<int64_t, kLimbs>;

  // Adds finite values exactly. Precondition: every value is finite (a NaN or infinity is a
  // caller bug; it is skipped under NDEBUG).
  void Add(float value);
  void Add(absl::Span<const float> values);

  // Adds another exact sum (its limbs, normalized or not).
  void Merge(const Limbs& limbs);

  // The canonical representation of the exact sum: limbs 0..8 in [0, 2^32), the top one signed.
  // Equal sums give equal limbs.
  Limbs limbs() const;

  // The sum rounded to a double by a fixed procedure on the canonical limbs, so equal exact sums
  // give bitwise-equal doubles (within an ulp or so of the exact value).
  double ToDouble() const;

 private:
  void Normalize();

  Limbs limbs_{};
  int64_t pending_ = 0;  // additions since the last normalisation
};

}  // namespace orthoshard

#endif  // ORTHOSHARD_COMMON_EXACT_SUM_H_
