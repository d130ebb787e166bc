// Quality metrics of a planned layout: padding, bucket count, and how evenly numel and
// Newton–Schulz work are spread over the data-parallel ranks. Pure arithmetic over the plan.
#ifndef ORTHOSHARD_LAYOUT_METRICS_H_
#define ORTHOSHARD_LAYOUT_METRICS_H_

#include <cstdint>
#include <vector>

#include "layout/layout.h"

namespace orthoshard::layout {

struct BufferMetrics {
  int buckets = 0;
  int64_t unpadded_numel = 0;  // sum of param numels
  int64_t padded_numel = 0;    // PerBufferParamLayout::numel(), padding included
  // (padded_numel - unpadded_numel) / unpadded_numel: the memory the layout adds, as Megatron
  // reports it ("overhead").
  double padding_fraction = 0;
  // Newton–Schulz cost (max(m,n)·min(m,n)² for 2-D params, numel otherwise) per rank, summed over
  // all buckets. A param straddling shards (distopt) is charged pro rata to the elements each
  // rank holds.
  std::vector<double> rank_ns_cost;
  // max over ranks of rank_ns_cost / its mean: how much longer the slowest rank's optimizer step
  // takes than a perfectly balanced one.
  double ns_cost_imbalance = 1;
  // The same ratio within each bucket (ranks' costs in that bucket only).
  std::vector<double> bucket_ns_cost_imbalance;
  // Param elements (padding excluded) each rank owns, summed over buckets, and max / mean of it.
  std::vector<int64_t> rank_numel;
  double numel_imbalance = 1;
};

// Metrics of `buffer`, whose params index into `specs` (the list given to ComputeFullParamLayout).
// Precondition: `buffer` was planned from `specs`.
BufferMetrics ComputeBufferMetrics(const PerBufferParamLayout& buffer,
                                   const std::vector<ParamSpec>& specs);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_METRICS_H_
