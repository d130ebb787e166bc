// DDP step anatomy at 2 Gloo ranks on this machine: backward time and the communication left
// after backward with overlap_grad_reduce off (the baseline), on, and on together with
// overlap_param_gather, all measured in one run; traffic per step from the communicator counters
// next to the ideal.
//
//   bazel run -c opt //ddp:ddp_benchmark [-- --layers 8 --hidden 1024 --batch 64 --iters 8]
//
// Model: `layers` tanh(h W^T + b) layers, W [hidden, hidden] fp32 Muon-managed (layer-wise
// buffer), b [hidden] fp32 Adam-managed (byte-level buffer). One intra-op thread per rank.
// Without RANK in the environment the binary relaunches itself with LaunchLocal; rank 0 prints the
// report.
//
// "exposed comm" is the time from the end of backward to the end of FinishGradSync: all of the
// reduce-scatter time without overlap, only the part not hidden behind backward with it. The
// hidden share is 1 - exposed(on) / exposed(off); on a machine without spare cores the
// communication threads also slow backward down, so the net share counts that slowdown against
// it. Bytes: the logical counters count the full buffer per collective; the ideal wire traffic
// per rank of a reduce-scatter plus an all-gather is 2 (N-1)/N x buffer bytes, which the Gloo
// communicator's rings send (its wire counters count what this rank sent).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/gloo_communicator.h"
#include "collectives/launch/launcher.h"
#include "collectives/rendezvous.h"
#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"
#include "layout/layout.h"

namespace orthoshard::ddp {
namespace {

struct Flags {
  int layers = 8;
  int64_t hidden = 1024;
  int64_t batch = 64;
  int iters = 8;
};

struct Mode {
  const char* name;
  bool overlap_grad;
  bool overlap_param;
};

struct Sample {
  double forward = 0, backward = 0, exposed = 0, param_sync = 0, step = 0;
};

double Seconds(absl::Time a, absl::Time b) { return absl::ToDoubleSeconds(b - a); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

absl::Status Barrier(collectives::Communicator& comm) {
  ASSIGN_OR_RETURN(auto work, comm.Barrier());
  return work->Wait(comm.timeout());
}

absl::Status RunRank(const Flags& flags) {
  at::set_num_threads(1);
  ASSIGN_OR_RETURN(collectives::RendezvousInfo info,
                   collectives::ParseRendezvous(collectives::ProcessEnvironment()));
  collectives::GlooOptions options = collectives::GlooOptionsFromRendezvous(info);
  options.timeout = absl::Minutes(5);
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Communicator> comm,
                   collectives::CreateGlooCommunicator(options));
  const int world = comm->size();

  std::vector<layout::ParamSpec> specs;
  std::vector<int> param_layers;
  for (int l = 0; l < flags.layers; ++l) {
    layout::ParamSpec w;
    w.name = absl::StrCat("layers.", l, ".w");
    w.shape = {flags.hidden, flags.hidden};
    w.dtype = DType::kFloat32;
    w.role = layout::ParamRole::kMuon;
    layout::ParamSpec b = w;
    b.name = absl::StrCat("layers.", l, ".b");
    b.shape = {flags.hidden};
    b.role = layout::ParamRole::kAdam;
    specs.push_back(w);
    specs.push_back(b);
    param_layers.push_back(l);
    param_layers.push_back(l);
  }
  layout::LayoutOptions layout_options;
  layout_options.dp = world;
  // A soft minimum: the shard-aligned layout puts one whole matrix in each rank's shard of a
  // bucket, so at 2 ranks each Muon bucket holds two matrices.
  layout_options.bucket_size = flags.hidden * flags.hidden;
  ASSIGN_OR_RETURN(layout::FullParamLayout plan,
                   layout::ComputeFullParamLayout(specs, layout_options));

  const Mode modes[] = {{"overlap off", false, false},
                        {"overlap_grad_reduce", true, false},
                        {"overlap grad + param", true, true}};
  constexpr int kModes = 3;
  std::vector<Sample> samples[kModes];
  int64_t traffic_bytes = 0, wire_bytes = 0, buffer_bytes = 0;
  int num_buckets = 0;
  const at::Tensor input = at::arange(flags.batch * flags.hidden, at::kFloat)
                               .mul(0.013)
                               .sin()
                               .reshape({flags.batch, flags.hidden});

  for (int round = 0; round < 2; ++round) {
    for (int m = 0; m < kModes; ++m) {
      std::vector<at::Tensor> params;
      for (const layout::ParamSpec& spec : specs) {
        params.push_back(at::arange(spec.numel(), at::kFloat)
                             .mul(0.37)
                             .sin()
                             .mul(1.0 / std::sqrt(static_cast<double>(flags.hidden)))
                             .reshape(spec.shape)
                             .clone()
                             .set_requires_grad(true));
      }
      DdpConfig config;
      config.overlap_grad_reduce = modes[m].overlap_grad;
      config.overlap_param_gather = modes[m].overlap_param;
      ASSIGN_OR_RETURN(std::unique_ptr<DistributedDataParallel> ddp,
                       DistributedDataParallel::Create(plan, params, comm.get(), nullptr, config));
      ASSIGN_OR_RETURN(std::function<void(int)> hook, ddp->PreForwardHook(param_layers));
      if (round == 0 && m == 0) {
        for (int b = 0; b < ddp->num_buffers(); ++b) {
          buffer_bytes += ddp->buffer(b).grad_data().nbytes();
          num_buckets += ddp->buffer(b).num_buckets();
        }
      }
      for (int it = 0; it < flags.iters + 1; ++it) {  // the first iteration warms up
        RETURN_IF_ERROR(Barrier(*comm));
        const collectives::TrafficCounters before = comm->traffic();
        const absl::Time t0 = absl::Now();
        ddp->ZeroGradBuffers();
        at::Tensor h = input;
        for (int l = 0; l < flags.layers; ++l) {
          hook(l);
          h = h.mm(params[2 * l].t()).add(params[2 * l + 1]).tanh();
        }
        at::Tensor loss = h.pow(2).sum().div(flags.batch);
        const absl::Time t1 = absl::Now();
        loss.backward();
        const absl::Time t2 = absl::Now();
        RETURN_IF_ERROR(ddp->FinishGradSync());
        const absl::Time t3 = absl::Now();
        RETURN_IF_ERROR(ddp->bucket_groups().StartParamSync());
        const absl::Time t4 = absl::Now();
        if (it == 0) continue;
        samples[m].push_back(
            {Seconds(t0, t1), Seconds(t1, t2), Seconds(t2, t3), Seconds(t3, t4), Seconds(t0, t4)});
        if (m == 0) {
          const collectives::TrafficCounters after = comm->traffic();
          traffic_bytes = 0;
          wire_bytes = 0;
          for (collectives::OpKind k :
               {collectives::OpKind::kReduceScatter, collectives::OpKind::kAllGather}) {
            traffic_bytes += after.Bytes(k) - before.Bytes(k);
            wire_bytes += after.WireBytes(k) - before.WireBytes(k);
          }
        }
      }
      RETURN_IF_ERROR(ddp->FinishParamSync());
    }
  }
  if (comm->rank() != 0) return absl::OkStatus();

  std::printf(
      "DDP step at %d Gloo ranks: %d layers of [%lld, %lld] + bias, batch %lld, %d buckets,"
      " %d steps per mode (median, ms)\n",
      world, flags.layers, static_cast<long long>(flags.hidden),
      static_cast<long long>(flags.hidden), static_cast<long long>(flags.batch), num_buckets,
      2 * flags.iters);
  std::printf("%-22s %9s %9s %13s %11s %9s %11s\n", "mode", "forward", "backward", "exposed comm",
              "param sync", "step", "step/off");
  double exposed[kModes], step[kModes], backward[kModes];
  for (int m = 0; m < kModes; ++m) {
    auto pick = [&](double Sample::*field) {
      std::vector<double> v;
      for (const Sample& s : samples[m]) v.push_back(s.*field * 1e3);
      return Median(v);
    };
    exposed[m] = pick(&Sample::exposed);
    step[m] = pick(&Sample::step);
    backward[m] = pick(&Sample::backward);
    std::printf("%-22s %9.2f %9.2f %13.2f %11.2f %9.2f %11.3f\n", modes[m].name,
                pick(&Sample::forward), backward[m], exposed[m], pick(&Sample::param_sync), step[m],
                step[m] / step[0]);
  }
  std::printf("hidden share of grad reduce-scatter time: %.1f%% (1 - exposed(on) / exposed(off))\n",
              100.0 * (1.0 - exposed[1] / exposed[0]));
  std::printf(
      "net hidden share (backward slowdown counted): %.1f%% (1 - (backward(on) + "
      "exposed(on) - backward(off)) / exposed(off))\n",
      100.0 * (1.0 - (backward[1] + exposed[1] - backward[0]) / exposed[0]));
  const double n = world;
  std::printf(
      "traffic per step: %.2f MB logical (counters: reduce-scatter + all-gather), "
      "buffer %.2f MB; ideal wire 2(N-1)/N x buffer = %.2f MB; wire sent by rank 0 (counters) = "
      "%.2f MB\n",
      traffic_bytes / 1e6, buffer_bytes / 1e6, 2 * (n - 1) / n * buffer_bytes / 1e6,
      wire_bytes / 1e6);
  return absl::OkStatus();
}

}  // namespace
}  // namespace orthoshard::ddp

int main(int argc, char** argv) {
  orthoshard::ddp::Flags flags;
  int nproc = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &value)) continue;
    if (std::strcmp(argv[i], "--layers") == 0) flags.layers = static_cast<int>(value);
    if (std::strcmp(argv[i], "--hidden") == 0) flags.hidden = value;
    if (std::strcmp(argv[i], "--batch") == 0) flags.batch = value;
    if (std::strcmp(argv[i], "--iters") == 0) flags.iters = static_cast<int>(value);
    if (std::strcmp(argv[i], "--nproc") == 0) nproc = static_cast<int>(value);
  }
  if (std::optional<int> launched = orthoshard::collectives::LaunchSelfUnlessRank(
          argc, argv, nproc, absl::Minutes(10))) {
    return *launched;
  }
  const absl::Status status = orthoshard::ddp::RunRank(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  std::fflush(stdout);
  std::_Exit(0);
}
