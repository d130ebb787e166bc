// Test helpers: checks every structural invariant of a FullParamLayout against the params and
// options it was planned from, and generates seeded random models for property tests.
#ifndef ORTHOSHARD_LAYOUT_TESTING_INVARIANTS_H_
#define ORTHOSHARD_LAYOUT_TESTING_INVARIANTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "layout/layout.h"

namespace orthoshard::layout::testing {

// OK if `layout` satisfies, for every buffer: each param exactly once, in the buffer its key
// says; params sorted, non-overlapping, 64-aligned, inside their bucket; buckets back to back from
// 0, each dp * shard_size long and non-empty; bucket ids non-decreasing in backprop order; a
// shared embedding alone in its bucket; bucket ends multiples of lcm(dp, 128). Shard-aligned
// strategies additionally: every param inside one shard, shard sizes multiples of
// lcm(64, lcm(dp, 128) / dp). Distopt additionally: buffer order is backprop order.
// Otherwise kInternal describing the first violation.
absl::Status CheckLayoutInvariants(const FullParamLayout& layout,
                                   const std::vector<ParamSpec>& params,
                                   const LayoutOptions& options);

// A random model of 1..`max_params` params drawn from `seed`: 1-D and 2-D shapes (odd sizes such
// as 333 included), Muon and Adam roles, experts, bf16/fp32, at most one shared embedding.
std::vector<ParamSpec> RandomModel(uint64_t seed, int max_params);

}  // namespace orthoshard::layout::testing

#endif  // ORTHOSHARD_LAYOUT_TESTING_INVARIANTS_H_
