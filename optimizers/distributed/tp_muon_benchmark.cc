// Benchmark of the optimizer step for Muon on tensor-parallel matrices (MuonTpMode) over 2 CPU Gloo
// ranks as tp 2 x dp 1 (started by this binary itself through LaunchLocal): gpt2-124m's matrices
// at tp 2 (testing/tp_model.h Gpt2Matrices: 12 layers of local qkv [1152, 768], proj [768, 384],
// fc1 [2048, 768] in 2 parts, fc2 [768, 1024]; bf16 params, fp32 grads, Muon's default bf16
// Newton–Schulz with the global FusedSplits). Modes, each timed on its own optimizer and buffers:
//   owner       each matrix orthogonalised once, at its home tp rank (two all-to-alls per step)
//   duplicated  every tp rank orthogonalises every whole matrix (one all-gather per step)
//   blockwise   each rank orthogonalises its own slices (no communication; another update)
// Repetitions are interleaved (owner, duplicated, blockwise, owner, ...), each one warm-up step and
// one timed ChainedOptimizer::Step (statistics all-reduce included); prints per mode the median
// wall time and rank 0's thread CPU time (robust on a shared machine), owner / duplicated of both
// (the goal: <= 0.55, ideal 0.5 at tp 2) and each rank's ns_cost.
//   bazel run //optimizers/distributed:tp_muon_benchmark -- [REPETITIONS [LAYERS]]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/gloo_communicator.h"
#include "collectives/launch/launcher.h"
#include "collectives/mesh.h"
#include "collectives/rendezvous.h"
#include "common/status_macros.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"
#include "optimizers/distributed/testing/tp_model.h"

namespace orthoshard::optimizers::distributed {
namespace {

using collectives::Communicator;

constexpr int kTp = 2;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU time of the calling thread (where ATen's one intra-op thread computes), in ms: the work a
// rank does, unlike wall time not inflated by other processes on a shared machine (and not
// counting the time it waits for its peer).
double ThreadCpuMs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct Timing {
  double wall_ms = 0;
  double cpu_ms = 0;
};

// One warm-up and one timed step of a fresh optimizer in `mode`; *ns_cost its ns_cost.
absl::StatusOr<Timing> TimeStep(Communicator& world, collectives::Mesh& mesh, MuonTpMode mode,
                                int layers, int repetition, double* ns_cost) {
  const std::vector<testing::TpParam> ps = testing::Gpt2Matrices(layers);
  ASSIGN_OR_RETURN(testing::DistributedModel model,
                   testing::BuildTpModel(ps, kTp, mesh.tp().rank(), /*dp=*/1,
                                         /*bucket_size=*/int64_t{1} << 22));
  ASSIGN_OR_RETURN(auto opt, CreateDistributedOptimizer(
                                 model.buffers, &mesh.dp(), testing::TestConfig(1.0),
                                 DistributedMode::kSharded, testing::GlobalSplits(ps), nullptr,
                                 nullptr, {&mesh.tp(), &world, mode}));
  *ns_cost = opt->ns_cost();
  Timing timing;
  for (int it = 0; it < 2; ++it) {
    testing::FillTpGrads(ps, model, kTp, mesh.tp().rank(), /*dp_rank=*/0, repetition * 2 + it);
    ASSIGN_OR_RETURN(auto barrier, world.Barrier());
    RETURN_IF_ERROR(barrier->Wait(world.timeout()));
    const absl::Time t0 = absl::Now();
    const double cpu0 = ThreadCpuMs();
    RETURN_IF_ERROR(opt->Step().status());
    timing.cpu_ms = ThreadCpuMs() - cpu0;
    timing.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);  // dp 1: no param sync
  }
  return timing;
}

absl::Status RunRank(int repetitions, int layers) {
  // One intra-op thread per rank, as torchrun's OMP_NUM_THREADS=1: ranks share the machine's cores.
  at::set_num_threads(1);
  ASSIGN_OR_RETURN(collectives::RendezvousInfo info,
                   collectives::ParseRendezvous(collectives::ProcessEnvironment()));
  collectives::GlooOptions gloo = collectives::GlooOptionsFromRendezvous(info);
  gloo.timeout = absl::Seconds(600);
  ASSIGN_OR_RETURN(auto world, collectives::CreateGlooCommunicator(gloo));
  collectives::MeshGrid grid;
  grid.tp = kTp;
  ASSIGN_OR_RETURN(collectives::Mesh mesh, collectives::Mesh::Create(*world, grid));
  const std::vector<MuonTpMode> modes = {MuonTpMode::kOwner, MuonTpMode::kDuplicated,
                                         MuonTpMode::kBlockwise};
  std::vector<std::vector<double>> ms(modes.size()), cpu(modes.size());
  std::vector<double> costs(modes.size());
  for (int r = 0; r < repetitions; ++r) {
    for (size_t m = 0; m < modes.size(); ++m) {
      ASSIGN_OR_RETURN(const Timing t, TimeStep(*world, mesh, modes[m], layers, r, &costs[m]));
      ms[m].push_back(t.wall_ms);
      cpu[m].push_back(t.cpu_ms);
    }
  }
  // Rank 0 prints; every rank's ns_cost in its own line.
  at::Tensor all_costs =
      at::zeros({static_cast<int64_t>(modes.size()), world->size()}, at::kDouble);
  for (size_t m = 0; m < modes.size(); ++m) all_costs[m][world->rank()].fill_(costs[m]);
  ASSIGN_OR_RETURN(auto work, world->AllReduce(all_costs));
  RETURN_IF_ERROR(work->Wait(world->timeout()));
  if (world->rank() != 0) return absl::OkStatus();
  std::printf("tp 2 x dp 1 (2 Gloo ranks, 1 thread each), gpt2-124m matrices x %d layers, bf16 "
              "Newton-Schulz, %d interleaved repetitions\n", layers, repetitions);
  for (size_t m = 0; m < modes.size(); ++m) {
    std::printf("%-10s step median %9.1f ms (min %9.1f, max %9.1f), rank 0 thread CPU median "
                "%9.1f ms, ns_cost rank 0 %.4g rank 1 %.4g",
                MuonTpModeName(modes[m]), Median(ms[m]),
                *std::min_element(ms[m].begin(), ms[m].end()),
                *std::max_element(ms[m].begin(), ms[m].end()), Median(cpu[m]),
                all_costs[m][0].item<double>(), all_costs[m][1].item<double>());
    if (modes[m] == MuonTpMode::kOwner) {
      std::printf("  owner/duplicated %.3f (min %.3f, CPU %.3f)", Median(ms[0]) / Median(ms[1]),
                  *std::min_element(ms[0].begin(), ms[0].end()) /
                      *std::min_element(ms[1].begin(), ms[1].end()),
                  Median(cpu[0]) / Median(cpu[1]));
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace orthoshard::optimizers::distributed

int main(int argc, char** argv) {
  using namespace orthoshard;
  int repetitions = 5;
  int layers = 12;
  if ((argc > 1 && !absl::SimpleAtoi(argv[1], &repetitions)) ||
      (argc > 2 && !absl::SimpleAtoi(argv[2], &layers)) || repetitions < 1 || layers < 1) {
    std::fprintf(stderr, "usage: %s [REPETITIONS [LAYERS]]\n", argv[0]);
    return 2;
  }
  if (std::optional<int> launched = collectives::LaunchSelfUnlessRank(argc, argv, 2)) {
    return *launched;
  }
  const absl::Status s = optimizers::distributed::RunRank(repetitions, layers);
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::fflush(stdout);
  std::_Exit(s.ok() ? 0 : 1);
}
