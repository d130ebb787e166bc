// Planning time for a 60-layer, 256-expert MoE (31,022 params, 30,720 of them experts) at dp 64,
// per strategy. Each benchmark also reports `vs_distopt`: its time per plan over the time of a
// distopt plan of the same model measured in the same process (the byte-level layout is a single
// pass over the params, so it is the floor any planner is compared to). Wall-clock medians: on a
// shared machine compare the ratio, not the absolute time.
//
//   bazel run -c opt //layout:layout_benchmark
#include <algorithm>
#include <chrono>
#include <vector>

#include "benchmark/benchmark.h"
#include "layout/layout.h"
#include "layout/presets.h"

namespace orthoshard::layout {
namespace {

constexpr int kDp = 64;

LayoutOptions Options(Strategy strategy) {
  LayoutOptions options;
  options.dp = kDp;
  options.bucket_size = std::max<int64_t>(40000000, int64_t{1000000} * kDp);  // Megatron default
  options.muon_strategy = strategy;
  return options;
}

double SecondsPerPlan(const std::vector<ParamSpec>& params, Strategy strategy, int runs) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto layout = ComputeFullParamLayout(params, Options(strategy));
    benchmark::DoNotOptimize(layout);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

const std::vector<ParamSpec>& MoeParams() {
  static const auto* params = new std::vector<ParamSpec>(Moe60x256Params());
  return *params;
}

void BM_PlanMoe(benchmark::State& state, Strategy strategy) {
  const std::vector<ParamSpec>& params = MoeParams();
  const LayoutOptions options = Options(strategy);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto layout = ComputeFullParamLayout(params, options);
    if (!layout.ok()) state.SkipWithError("planning failed");
    benchmark::DoNotOptimize(layout);
  }
  const double per_plan =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  // Measured right after the loop so that both see the same machine load.
  const double baseline = SecondsPerPlan(params, Strategy::kDistOpt, 15);
  state.counters["params"] = static_cast<double>(params.size());
  state.counters["vs_distopt"] = per_plan / baseline;
}

BENCHMARK_CAPTURE(BM_PlanMoe, distopt, Strategy::kDistOpt)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanMoe, megatron_lpt, Strategy::kMegatronLpt)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanMoe, layerwise, Strategy::kLayerwise)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace orthoshard::layout
