// Strategy::kMegatronLpt: a port of Megatron-LM's layer-wise layout
// (LayerWiseDistributedOptimizer._compute_per_buffer_param_layout, main branch, with the
// compute-balanced LPT packer and the padding-absorb bucket cutter), kept as the baseline that
// Strategy::kLayerwise is measured against. Constants and tie-breaks follow Megatron exactly.
#include <algorithm>
#include <vector>

#include "layout/internal/planning.h"
#include "layout/layout.h"

namespace orthoshard::layout::internal_layout {
namespace {

// A chunk closes only once it holds at least dp * (largest param) * kPaddingFloor elements, which
// caps the per-bucket padding caused by one dominant param at 1 / 0.9 - 1 (~11%).
constexpr double kPaddingFloor = 0.9;
// Per-bucket cap on a shard's numel, as a factor over the mean, when placing by compute load.
constexpr double kNumelSlack = 1.3;

int ArgMin(const std::vector<int64_t>& v) {
  return static_cast<int>(std::min_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

void PlanMegatronLpt(const BufferInput& input, PerBufferParamLayout* out) {
  const std::vector<ParamSpec>& specs = *input.specs;
  const int dp = input.dp;
  const int64_t divisor = ShardDivisor(dp);
  // Newton–Schulz compute per shard, carried across buckets so expensive params spread globally.
  std::vector<double> compute_loads(dp, 0.0);

  auto emit_chunk = [&](const std::vector<int>& chunk) {
    if (chunk.empty()) return;
    int64_t chunk_numel = 0;
    for (int i : chunk) chunk_numel += specs[i].numel();
    const double max_shard_numel = static_cast<double>(chunk_numel) / dp * kNumelSlack;
    std::vector<int> order = chunk;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return NsCost(specs[a]) > NsCost(specs[b]); });
    ShardPacking packing;
    packing.shards.assign(dp, {});
    std::vector<int64_t> cursors(dp, 0);
    for (int i : order) {
      const int64_t numel = specs[i].numel();
      int shard = -1;
      for (int s = 0; s < dp; ++s) {
        if (static_cast<double>(Pad64(cursors[s]) + numel) > max_shard_numel) continue;
        if (shard < 0 || compute_loads[s] < compute_loads[shard]) shard = s;
      }
      if (shard < 0) shard = ArgMin(cursors);
      cursors[shard] = Pad64(cursors[shard]) + numel;
      compute_loads[shard] += NsCost(specs[i]);
      packing.shards[shard].push_back(i);
    }
    packing.shard_size = PadTo(*std::max_element(cursors.begin(), cursors.end()), divisor);
    EmitShardAlignedBucket(specs, packing, out);
  };

  // A shared embedding sits alone in shard 0 of its own bucket; shards 1..dp-1 are padding.
  auto emit_isolated = [&](int index) {
    ShardPacking packing;
    packing.shards.assign(dp, {});
    packing.shards[0].push_back(index);
    packing.shard_size = PadTo(specs[index].numel(), divisor);
    compute_loads[0] += NsCost(specs[index]);
    EmitShardAlignedBucket(specs, packing, out);
  };

  std::vector<int> chunk;
  int64_t chunk_numel = 0;
  int64_t chunk_max_param = 0;
  // Numel-LPT placement of the chunk so far, mirrored incrementally to decide whether the next
  // param fills existing shard padding ("is absorbed") rather than growing the bucket.
  std::vector<int64_t> shard_loads(dp, 0);
  auto reset_chunk = [&]() {
    chunk.clear();
    chunk_numel = 0;
    chunk_max_param = 0;
    std::fill(shard_loads.begin(), shard_loads.end(), 0);
  };
  auto absorbs = [&](int64_t numel) {
    const int64_t target = PadTo(*std::max_element(shard_loads.begin(), shard_loads.end()), divisor);
    return Pad64(*std::min_element(shard_loads.begin(), shard_loads.end())) + numel <= target;
  };

  for (auto it = input.indices.rbegin(); it != input.indices.rend(); ++it) {
    const ParamSpec& spec = specs[*it];
    const int64_t numel = spec.numel();
    if (spec.shared_embedding) {
      emit_chunk(chunk);
      reset_chunk();
      emit_isolated(*it);
      continue;
    }
    if (input.bucket_size.has_value() && !chunk.empty()) {
      const int64_t threshold = std::max(
          *input.bucket_size,
          static_cast<int64_t>(static_cast<double>(dp) * chunk_max_param * kPaddingFloor));
      if (chunk_numel >= threshold && !absorbs(numel)) {
        emit_chunk(chunk);
        reset_chunk();
      }
    }
    const int shard = ArgMin(shard_loads);
    shard_loads[shard] = Pad64(shard_loads[shard]) + numel;
    chunk.push_back(*it);
    chunk_numel += numel;
    chunk_max_param = std::max(chunk_max_param, numel);
  }
  emit_chunk(chunk);
}

}  // namespace orthoshard::layout::internal_layout
