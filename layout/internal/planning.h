// Internal helpers shared by the layout strategies: alignment arithmetic, Newton–Schulz cost, and
// the per-buffer planners. Not part of the public API; use layout/layout.h.
#ifndef ORTHOSHARD_LAYOUT_INTERNAL_PLANNING_H_
#define ORTHOSHARD_LAYOUT_INTERNAL_PLANNING_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "layout/layout.h"

namespace orthoshard::layout::internal_layout {

// Param starts are aligned to this many elements (Megatron's pad_param_start).
inline constexpr int64_t kParamAlignment = 64;

// Smallest multiple of `divisor` that is >= `value` (value >= 0, divisor > 0).
inline int64_t PadTo(int64_t value, int64_t divisor) {
  return (value + divisor - 1) / divisor * divisor;
}
inline int64_t Pad64(int64_t value) { return PadTo(value, kParamAlignment); }

// Bucket ends are padded to lcm(dp, 128) elements (Megatron's bucket_end_divisor, without the
// high-NCCL-bus-bandwidth option).
int64_t BucketEndDivisor(int dp);
// Shard sizes of shard-aligned layouts are multiples of lcm(64, lcm(dp, 128) / dp), so that
// dp * shard_size meets the bucket-end alignment and every shard start is 64-aligned.
int64_t ShardDivisor(int dp);

// Newton–Schulz cost of orthogonalising `spec`: max(m, n) * min(m, n)^2 for a 2-D param (the
// matmul flops of one iteration up to a constant), numel otherwise.
double NsCost(const ParamSpec& spec);

// The params of one buffer, in forward order, and how to shard it.
struct BufferInput {
  const std::vector<ParamSpec>* specs = nullptr;
  std::vector<int> indices;  // indices into *specs, forward (model-definition) order
  int dp = 1;
  std::optional<int64_t> bucket_size;  // soft minimum bucket numel; nullopt = one bucket
  double padding_tolerance = 0.001;    // kLayerwise: LayoutOptions::padding_tolerance
  bool isolate_large_params = false;   // kDistOpt: LayoutOptions::isolate_large_params
};

// Each fills out->params, out->buckets and out->unpadded_numel (key, strategy and dp are set by the
// caller). Preconditions: specs validated, dp >= 1, bucket_size >= 1 if set, indices non-empty.
void PlanDistOpt(const BufferInput& input, PerBufferParamLayout* out);
void PlanMegatronLpt(const BufferInput& input, PerBufferParamLayout* out);
void PlanLayerwise(const BufferInput& input, PerBufferParamLayout* out);

// One bucket of a shard-aligned layout: params per shard in placement order, and the shard size.
struct ShardPacking {
  std::vector<std::vector<int>> shards;  // [dp][k]: spec indices placed in shard r, in order
  int64_t shard_size = 0;
};

// Appends `packing` as the next bucket of `out` (starting at out->numel()), placing each shard's
// params at 64-aligned cursors from the shard start.
void EmitShardAlignedBucket(const std::vector<ParamSpec>& specs, const ShardPacking& packing,
                            PerBufferParamLayout* out);

}  // namespace orthoshard::layout::internal_layout

#endif  // ORTHOSHARD_LAYOUT_INTERNAL_PLANNING_H_
