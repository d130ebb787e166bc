// The field checks ValidateTrainerConfig runs first (trainer_config.h): every double field within
// its DoubleRange, and no flag given where the configured mode never reads it. Private to
// //integration/config:trainer_config; the constants are shared with trainer_config.cc's checks of
// several fields together.
#ifndef ORTHOSHARD_INTEGRATION_CONFIG_FIELD_CHECKS_H_
#define ORTHOSHARD_INTEGRATION_CONFIG_FIELD_CHECKS_H_

#include "absl/status/status.h"
#include "integration/config/trainer_config.h"

namespace orthoshard::integration::internal_config {

// The most a scalar that the optimizers hand to an fp32 or bf16 kernel may be in magnitude (a step
// size, a decay factor, eps). Both types overflow past FLT_MAX ~ 2^128 (8 exponent bits): a
// scalar of at most 2^64 times a tensor entry of at most 2^64 (far beyond any trained model's
// weights, gradients or moments) stays below it. A double scalar that an fp32 op cannot hold at
// all makes LibTorch throw in the middle of a step, on every rank.
constexpr double kMaxKernelScalar = 0x1p64;
// The largest Muon lr scale a rule gives per unit of its factor: sqrt(max(rows, cols)) (and
// sqrt(rows / cols) <= sqrt(rows)) is at most sqrt(2^50) = 2^25, the planner's bound on a
// param's elements (layout/layout.h).
constexpr double kMaxMuonShapeScale = 0x1p25;

// Every double field of `c` within its DoubleRange. Errors: kInvalidArgument "--lr must be in
// (0, 2^64], got 1e+39 (a step size, ...)"; kInternal for a double field without a range.
absl::Status ValidateDoubleRanges(const TrainerConfig& c);

// The flags given (c.given) that do nothing in the configured mode. Errors: kInvalidArgument
// naming the flag and what it needs ("--fsdp_grad_syncs_in_flight needs --dist=fsdp; ...").
absl::Status ValidateGivenFlags(const TrainerConfig& c);

}  // namespace orthoshard::integration::internal_config

#endif  // ORTHOSHARD_INTEGRATION_CONFIG_FIELD_CHECKS_H_
