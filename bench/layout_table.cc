// Prints, as one JSON document on stdout, the layout quality of every strategy for the presets
// the report tabulates (gpt8b, llama3_8b_gqa, moe_60x256) at dp 2..64: padding fraction, bucket
// count and Newton–Schulz cost imbalance, summed over the model's buffers. Pure arithmetic over
// the plan (layout/metrics.h), so one run is exact and needs no repeats.
//
//   bazel run //bench:layout_table
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "layout/layout.h"
#include "layout/metrics.h"
#include "layout/presets.h"

namespace orthoshard::bench {
namespace {

using layout::BufferMetrics;
using layout::ComputeBufferMetrics;
using layout::ComputeFullParamLayout;
using layout::FullParamLayout;
using layout::LayoutOptions;
using layout::ParamSpec;
using layout::Strategy;

// One strategy at one dp, aggregated over every buffer of the plan.
std::string RowJson(const std::string& preset, const std::vector<ParamSpec>& params, int dp,
                    Strategy strategy, bool* ok) {
  LayoutOptions options;
  options.dp = dp;
  options.bucket_size = std::max<int64_t>(40000000, int64_t{1000000} * dp);  // Megatron default
  options.muon_strategy = strategy;
  auto planned = ComputeFullParamLayout(params, options);
  if (!planned.ok()) {
    std::fprintf(stderr, "%s dp %d %s: %s\n", preset.c_str(), dp, layout::StrategyName(strategy),
                 planned.status().ToString().c_str());
    *ok = false;
    return "";
  }
  int64_t unpadded = 0, padded = 0;
  int buckets = 0;
  // Per-rank NS cost summed over buffers: every buffer here is sharded over the same dp.
  std::vector<double> rank_cost(dp, 0.0);
  double worst_bucket = 1.0;
  for (const auto& buffer : planned->buffers) {
    const BufferMetrics m = ComputeBufferMetrics(buffer, params);
    unpadded += m.unpadded_numel;
    padded += m.padded_numel;
    buckets += m.buckets;
    for (size_t r = 0; r < m.rank_ns_cost.size() && r < rank_cost.size(); ++r) {
      rank_cost[r] += m.rank_ns_cost[r];
    }
    for (double b : m.bucket_ns_cost_imbalance) worst_bucket = std::max(worst_bucket, b);
  }
  double sum = 0, max = 0;
  for (double c : rank_cost) {
    sum += c;
    max = std::max(max, c);
  }
  const double imbalance = sum > 0 ? max / (sum / dp) : 1.0;
  return absl::StrCat("{\"preset\": \"", preset, "\", \"dp\": ", dp, ", \"strategy\": \"",
                      layout::StrategyName(strategy), "\", \"params\": ", params.size(),
                      ", \"buffers\": ", planned->buffers.size(), ", \"buckets\": ", buckets,
                      ", \"unpadded_numel\": ", unpadded, ", \"padded_numel\": ", padded,
                      ", \"padding_fraction\": ",
                      unpadded > 0 ? static_cast<double>(padded - unpadded) / unpadded : 0.0,
                      ", \"ns_cost_imbalance\": ", imbalance,
                      ", \"worst_bucket_ns_cost_imbalance\": ", worst_bucket, "}");
}

int Main() {
  const std::vector<std::pair<std::string, std::vector<ParamSpec>>> presets = {
      {"gpt8b", layout::Gpt8bParams()},
      {"llama3_8b_gqa", layout::Llama3GqaParams()},
      {"moe_60x256", layout::Moe60x256Params()},
  };
  std::vector<std::string> rows;
  bool ok = true;
  for (const auto& [name, params] : presets) {
    for (int dp : {2, 4, 8, 16, 32, 64}) {
      for (Strategy s : {Strategy::kLayerwise, Strategy::kMegatronLpt, Strategy::kDistOpt}) {
        std::string row = RowJson(name, params, dp, s, &ok);
        if (!ok) return 1;
        rows.push_back(std::move(row));
      }
    }
  }
  std::printf("{\"rows\": [\n  %s\n]}\n", absl::StrJoin(rows, ",\n  ").c_str());
  return 0;
}

}  // namespace
}  // namespace orthoshard::bench

int main() { return orthoshard::bench::Main(); }
