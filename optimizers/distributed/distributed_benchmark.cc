// Benchmark of one optimizer step + param sync over 2 CPU Gloo ranks (started by this binary
// itself through LaunchLocal), on a model of 8 [512, 512] hidden matrices plus norms and an
// embedding, all bf16 with fp32 grads. Modes, measured in one run:
//   layerwise         Muon matrices in a layerwise buffer (each rank orthogonalises its own half),
//                     AdamW ZeRO-1 for the rest; grads reduce-scattered, params all-gathered
//   replicated        grads all-reduced, every rank runs Muon on every matrix (the baseline)
//   distopt_adamw     everything ZeRO-1 (distopt layout, every param routed to AdamW: the Muon
//                     matrices of a distopt layout straddle shards and cannot be orthogonalised
//                     from a slice)
//   replicated_adamw  everything AdamW, all-reduce baseline for distopt_adamw
// Reports the median time of Step+param sync (and of the grad collective) per mode, ratios against
// the baseline, and the communication per step from the communicator's counters (logical bytes:
// reduce-scatter input, all-gather output, all-reduce tensor) next to the ring ideal of an
// all-reduce of the grad buffer, 2 (N - 1) / N x buffer bytes.
//   bazel run //optimizers/distributed:distributed_benchmark -- [ITERATIONS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "buffers/bucket_sync.h"
#include "collectives/gloo_communicator.h"
#include "collectives/launch/launcher.h"
#include "collectives/rendezvous.h"
#include "common/status_macros.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::optimizers::distributed {
namespace {

using collectives::Communicator;
using collectives::OpKind;

struct ModeResult {
  std::string name;
  double step_ms = 0;      // median Step + param sync
  double grad_ms = 0;      // median grad reduce-scatter / all-reduce
  int64_t bytes_rs = 0, bytes_ag = 0, bytes_ar = 0;  // logical bytes per iteration
  int64_t grad_buffer_bytes = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<ModeResult> RunMode(Communicator& comm, const std::string& name, int iterations) {
  const bool layerwise = name == "layerwise" || name == "replicated";
  const DistributedMode mode = (name == "layerwise" || name == "distopt_adamw")
                                   ? DistributedMode::kSharded
                                   : DistributedMode::kReplicated;
  std::vector<layout::ParamSpec> specs = testing::LargeModel(8, 512, 512, 2048);
  // The AdamW-only modes route every param to AdamW (in the layout, where routing is published).
  if (!layerwise) {
    for (layout::ParamSpec& s : specs) s.role = layout::ParamRole::kAdam;
  }
  ASSIGN_OR_RETURN(testing::DistributedModel model,
                   testing::BuildDistributedModel(
                       specs, comm.size(),
                       layerwise ? layout::Strategy::kLayerwise : layout::Strategy::kDistOpt,
                       /*bucket_size=*/1 << 20));
  const ChainedConfig config = testing::TestConfig(/*max_grad_norm=*/1.0);
  ASSIGN_OR_RETURN(auto opt, CreateDistributedOptimizer(model.buffers, &comm, config, mode));
  ModeResult result;
  result.name = name;
  for (auto* b : model.buffers) result.grad_buffer_bytes += b->grad_data().nbytes();
  std::vector<double> step_ms, grad_ms;
  collectives::TrafficCounters start;
  for (int it = -2; it < iterations; ++it) {  // 2 warm-up iterations
    if (it == 0) start = comm.traffic();
    testing::FillRankGrads(specs, model, comm.rank(), it + 2);
    ASSIGN_OR_RETURN(auto barrier, comm.Barrier());
    RETURN_IF_ERROR(barrier->Wait(comm.timeout()));
    const absl::Time t0 = absl::Now();
    const buffers::GradSync sync = mode == DistributedMode::kSharded
                                       ? buffers::GradSync::kReduceScatter
                                       : buffers::GradSync::kAllReduce;
    ASSIGN_OR_RETURN(auto works, buffers::LaunchGradSync(comm, model.buffers, sync,
                                                         collectives::ReduceOp::kAvg));
    RETURN_IF_ERROR(buffers::WaitAll(works, comm.timeout()));
    const absl::Time t1 = absl::Now();
    RETURN_IF_ERROR(opt->Step().status());
    if (mode == DistributedMode::kSharded) {  // replicated ranks hold every updated param already
      ASSIGN_OR_RETURN(auto param_sync, buffers::LaunchParamSync(comm, model.buffers));
      RETURN_IF_ERROR(buffers::WaitAll(param_sync, comm.timeout()));
    }
    const absl::Time t2 = absl::Now();
    if (it >= 0) {
      grad_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
      step_ms.push_back(absl::ToDoubleMilliseconds(t2 - t1));
    }
  }
  const collectives::TrafficCounters end = comm.traffic();
  auto per_iter = [&](OpKind k) { return (end.Bytes(k) - start.Bytes(k)) / iterations; };
  result.bytes_rs = per_iter(OpKind::kReduceScatter);
  result.bytes_ag = per_iter(OpKind::kAllGather);
  result.bytes_ar = per_iter(OpKind::kAllReduce);
  result.step_ms = Median(step_ms);
  result.grad_ms = Median(grad_ms);
  return result;
}

absl::Status RunRank(int iterations) {
  // One intra-op thread per rank, as torchrun's OMP_NUM_THREADS=1: ranks share the machine's cores.
  at::set_num_threads(1);
  ASSIGN_OR_RETURN(collectives::RendezvousInfo info,
                   collectives::ParseRendezvous(collectives::ProcessEnvironment()));
  collectives::GlooOptions gloo = collectives::GlooOptionsFromRendezvous(info);
  gloo.timeout = absl::Seconds(300);
  ASSIGN_OR_RETURN(auto comm, collectives::CreateGlooCommunicator(gloo));
  std::vector<ModeResult> results;
  // Each mode twice, interleaved; the second round is reported (the first warms caches and pools).
  for (int round = 0; round < 2; ++round) {
    results.clear();
    for (const char* mode : {"replicated", "layerwise", "replicated_adamw", "distopt_adamw"}) {
      ASSIGN_OR_RETURN(ModeResult r, RunMode(*comm, mode, iterations));
      results.push_back(r);
    }
  }
  if (comm->rank() != 0) return absl::OkStatus();
  const int n = comm->size();
  std::printf("%d ranks, %d iterations, model 8 x [512, 512] Muon + norms + [2048, 512] embedding\n",
              n, iterations);
  std::printf("%-17s %12s %8s %12s %10s %10s %10s %13s %12s\n", "mode", "step+sync ms", "ratio",
              "grad sync ms", "RS MB", "AG MB", "AR MB", "wire MB/rank", "ideal MB");
  for (const ModeResult& r : results) {
    const bool adam = r.name.find("adamw") != std::string::npos;
    const double baseline = adam ? results[2].step_ms : results[0].step_ms;
    // Ring estimates per rank: reduce-scatter and all-gather move (N-1)/N of their logical bytes,
    // an all-reduce 2 (N-1)/N.
    const double f = static_cast<double>(n - 1) / n;
    const double wire = f * (r.bytes_rs + r.bytes_ag) + 2 * f * r.bytes_ar;
    const double ideal = 2 * f * r.grad_buffer_bytes;
    std::printf("%-17s %12.2f %8.3f %12.2f %10.2f %10.2f %10.2f %13.2f %12.2f\n", r.name.c_str(),
                r.step_ms, r.step_ms / baseline, r.grad_ms, r.bytes_rs / 1e6, r.bytes_ag / 1e6,
                r.bytes_ar / 1e6, wire / 1e6, ideal / 1e6);
  }
  std::printf("ratio: step+sync time / the replicated mode of the same optimizer, same run\n");
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace orthoshard::optimizers::distributed

int main(int argc, char** argv) {
  using namespace orthoshard;
  int iterations = 5;
  if (argc > 1 && !absl::SimpleAtoi(argv[1], &iterations)) {
    std::fprintf(stderr, "usage: %s [ITERATIONS]\n", argv[0]);
    return 2;
  }
  if (std::optional<int> launched = collectives::LaunchSelfUnlessRank(argc, argv, 2)) {
    return *launched;
  }
  const absl::Status s = optimizers::distributed::RunRank(iterations);
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::fflush(stdout);
  std::_Exit(s.ok() ? 0 : 1);
}
