#include "layout/metrics.h"

#include <algorithm>
#include <numeric>

#include "layout/internal/planning.h"

namespace orthoshard::layout {
namespace {

template <typename T>
double MaxOverMean(const std::vector<T>& v) {
  if (v.empty()) return 1;
  const double sum = std::accumulate(v.begin(), v.end(), 0.0);
  if (sum <= 0) return 1;
  return static_cast<double>(*std::max_element(v.begin(), v.end())) / (sum / v.size());
}

}  // namespace

BufferMetrics ComputeBufferMetrics(const PerBufferParamLayout& buffer,
                                   const std::vector<ParamSpec>& specs) {
  BufferMetrics m;
  const int dp = buffer.dp;
  m.buckets = static_cast<int>(buffer.buckets.size());
  m.unpadded_numel = buffer.unpadded_numel;
  m.padded_numel = buffer.numel();
  m.padding_fraction = buffer.unpadded_numel > 0
                           ? static_cast<double>(m.padded_numel - m.unpadded_numel) /
                                 static_cast<double>(m.unpadded_numel)
                           : 0.0;
  m.rank_ns_cost.assign(dp, 0.0);
  m.rank_numel.assign(dp, 0);
  std::vector<std::vector<double>> bucket_costs(m.buckets, std::vector<double>(dp, 0.0));
  for (const ParamPlacement& p : buffer.params) {
    const Bucket& b = buffer.buckets[p.bucket];
    const double cost = internal_layout::NsCost(specs[p.param_index]);
    const int first = static_cast<int>((p.start - b.start) / b.shard_size);
    const int last = static_cast<int>((p.end - 1 - b.start) / b.shard_size);
    for (int r = first; r <= last; ++r) {
      const auto [lo, hi] = buffer.ShardRange(p.bucket, r);
      const int64_t overlap = std::min(hi, p.end) - std::max(lo, p.start);
      const double share = cost * static_cast<double>(overlap) / static_cast<double>(p.numel());
      m.rank_numel[r] += overlap;
      m.rank_ns_cost[r] += share;
      bucket_costs[p.bucket][r] += share;
    }
  }
  m.ns_cost_imbalance = MaxOverMean(m.rank_ns_cost);
  m.numel_imbalance = MaxOverMean(m.rank_numel);
  for (const auto& costs : bucket_costs) m.bucket_ns_cost_imbalance.push_back(MaxOverMean(costs));
  return m;
}

}  // namespace orthoshard::layout
