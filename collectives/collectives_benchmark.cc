// Bus bandwidth of reduce-scatter and all-gather on the Gloo communicator, each next to an
// all-reduce of the same size measured in the same run, at 2 ranks on this machine.
//
//   bazel run -c opt //collectives:collectives_benchmark [-- --max_mb 256 --nproc 2]
//
// Without RANK in the environment the binary relaunches itself with LaunchLocal; rank 0 prints the
// table. Sizes are the full (unsharded) fp32 buffer. Bus bandwidth follows nccl-tests
// (PERFORMANCE.md): algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce and
// algbw * (n-1)/n for reduce-scatter and all-gather, so an optimal implementation of each reaches
// the same busbw. The communicator's reduce-scatter and all-gather are rings over Gloo's send/recv
// (internal/ring.h), its all-reduce Gloo's own; the ratio columns compare them.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/gloo_communicator.h"
#include "collectives/launch/launcher.h"
#include "collectives/rendezvous.h"

namespace orthoshard::collectives {
namespace {

absl::Status Check(absl::StatusOr<std::unique_ptr<Work>> work, Communicator& comm) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(comm.timeout());
}

// Seconds one collective takes, started right after a barrier so every rank starts together.
template <typename Launch>
absl::StatusOr<double> TimeOnce(Communicator& comm, Launch launch) {
  absl::Status status = Check(comm.Barrier(), comm);
  if (!status.ok()) return status;
  const absl::Time start = absl::Now();
  status = Check(launch(), comm);
  if (!status.ok()) return status;
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunRank(int max_mb) {
  auto info = ParseRendezvous(ProcessEnvironment());
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
    return 1;
  }
  GlooOptions options = GlooOptionsFromRendezvous(*info);
  options.timeout = absl::Seconds(120);
  auto created = CreateGlooCommunicator(options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **created;
  const int n = comm.size();
  const int rank = comm.rank();
  if (rank == 0) {
    std::printf("gloo, %d ranks, fp32, median of N timed runs after 1 warm-up\n", n);
    std::printf("%8s %4s %12s %12s %12s %10s %10s\n", "size_MB", "N", "allreduce", "reduce_scat",
                "all_gather", "rs/ar", "ag/ar");
    std::printf("%8s %4s %12s %12s %12s %10s %10s\n", "", "", "busbw_GB/s", "busbw_GB/s",
                "busbw_GB/s", "busbw", "busbw");
  }
  for (int mb = 1; mb <= max_mb; mb *= 2) {
    const int64_t bytes = int64_t{mb} << 20;
    const int64_t numel = bytes / 4;
    const int64_t shard = numel / n;
    at::Tensor ar = at::zeros({numel}, at::kFloat);
    at::Tensor rs = at::zeros({numel}, at::kFloat);
    at::Tensor ag = at::zeros({numel}, at::kFloat);
    at::Tensor rs_out = at::empty({shard}, at::kFloat);
    const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{512} << 20) / bytes, 3, 20));
    std::vector<double> t_ar, t_rs, t_ag;
    for (int i = 0; i <= iters; ++i) {
      auto a = TimeOnce(comm, [&] { return comm.AllReduce(ar); });
      auto r = TimeOnce(comm, [&] { return comm.ReduceScatter(rs, rs_out); });
      auto g =
          TimeOnce(comm, [&] { return comm.AllGather(ag.narrow(0, rank * shard, shard), ag); });
      if (!a.ok() || !r.ok() || !g.ok()) {
        std::fprintf(stderr, "rank %d: %s %s %s\n", rank, a.status().ToString().c_str(),
                     r.status().ToString().c_str(), g.status().ToString().c_str());
        return 1;
      }
      if (i == 0) continue;  // warm-up
      t_ar.push_back(*a);
      t_rs.push_back(*r);
      t_ag.push_back(*g);
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    const double ar_bus = gb / Median(t_ar) * 2.0 * (n - 1) / n;
    const double rs_bus = gb / Median(t_rs) * (n - 1) / n;
    const double ag_bus = gb / Median(t_ag) * (n - 1) / n;
    if (rank == 0) {
      std::printf("%8d %4d %12.3f %12.3f %12.3f %10.3f %10.3f\n", mb, iters, ar_bus, rs_bus, ag_bus,
                  rs_bus / ar_bus, ag_bus / ar_bus);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    const TrafficCounters traffic = comm.traffic();
    std::printf(
        "logical traffic launched by rank 0: all_reduce %.1f MB in %lld calls, "
        "reduce_scatter %.1f MB, all_gather %.1f MB\n",
        traffic.Bytes(OpKind::kAllReduce) / 1048576.0,
        static_cast<long long>(traffic.Calls(OpKind::kAllReduce)),
        traffic.Bytes(OpKind::kReduceScatter) / 1048576.0,
        traffic.Bytes(OpKind::kAllGather) / 1048576.0);
  }
  Check(comm.Barrier(), comm).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace orthoshard::collectives

int main(int argc, char** argv) {
  int max_mb = 256;
  int nproc = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--max_mb") == 0) absl::SimpleAtoi(argv[i + 1], &max_mb);
    if (std::strcmp(argv[i], "--nproc") == 0) absl::SimpleAtoi(argv[i + 1], &nproc);
  }
  if (std::optional<int> launched = orthoshard::collectives::LaunchSelfUnlessRank(
          argc, argv, nproc, absl::Minutes(10))) {
    return *launched;
  }
  return orthoshard::collectives::RunRank(max_mb);
}
