// Benchmarks: one Muon step on a 1024x4096 fp32 matrix against the matrix products it contains, and
// one AdamW step against a plain memory copy of the same size, each baseline timed in the same run
// with the same intra-op thread count.
//
//   bazel run -c opt //optimizers:optimizers_benchmark -- --benchmark_min_time=2
//
// Both sides of each ratio run in the same iteration with the same intra-op (OpenMP) thread count;
// BM_MuonStep also runs single-threaded, which is less sensitive to a shared, busy machine.
//
// Counters:
//   BM_MuonStep: muon_ms, mm_ms (5 x [X X^T, A A, B X] as at::mm in the NS dtype), and
//                mm_fraction = mm_ms / muon_ms (goal >= 0.8: the step is dominated by its gemms);
//                ns_ms is NewtonSchulz alone (PyTorch's op order: one mm and two addmm with
//                beta != 1 per iteration, plus the input copy and normalisation) and mm_over_ns =
//                mm_ms / ns_ms, the share of the gap that is the iteration itself, not the step.
//   BM_MuonElementwise: aten_ms (ATen's elementwise ops of a Muon step), fused_ms (the fused CPU
//                passes that MuonUpdate runs instead, bitwise equal), speedup = aten_ms / fused_ms.
//   BM_AdamWFused: aten_ms (AdamW's ATen ops), fused_ms (FusedAdamW, bitwise equal), speedup;
//                aten_fused_ms (AdamWUpdate with AdamWHyper::fused: ATen's at::_fused_adamw_, the
//                kernel of torch.optim.AdamW(fused=True)) and aten_fused_speedup = aten_ms / it.
//   BM_AdamWStep: adamw_GBps counts the 7 fp32 tensor passes an ideal fused AdamW needs (read p, g,
//                m, v; write p, m, v); copy_GBps is dst.copy_(src) of one tensor (2 passes);
//                ratio = adamw_GBps / copy_GBps.
#include <chrono>
#include <cstdint>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>

#include "benchmark/benchmark.h"
#include "optimizers/adamw.h"
#include "optimizers/internal/fused_elementwise.h"
#include "optimizers/muon.h"

namespace orthoshard::optimizers {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Args: {NS dtype (0 = bf16, 1 = fp32), intra-op threads (0 = LibTorch's default)}.
void BM_MuonStep(benchmark::State& state) {
  const int default_threads = at::get_num_threads();
  if (state.range(1) > 0) at::set_num_threads(static_cast<int>(state.range(1)));
  const int64_t rows = 1024, cols = 4096;
  MuonHyper hp;
  hp.ns.dtype = state.range(0) == 0 ? NsDType::kBFloat16 : NsDType::kFloat32;
  const at::ScalarType ns_type = state.range(0) == 0 ? at::kBFloat16 : at::kFloat;
  const at::Tensor param = at::randn({rows, cols}, at::kFloat);
  const at::Tensor grad = at::randn({rows, cols}, at::kFloat);
  const at::Tensor momentum = at::zeros_like(param);
  const at::Tensor x = at::randn({rows, cols}, ns_type);
  const at::Tensor a = at::randn({rows, rows}, ns_type);
  double muon_s = 0.0, mm_s = 0.0, ns_s = 0.0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    MuonUpdate(param, grad, momentum, hp, 1e-3, FusedSplit{});
    const auto t1 = Clock::now();
    for (int i = 0; i < hp.ns.ns_steps; ++i) {
      benchmark::DoNotOptimize(at::mm(x, x.t()));  // Gram matrix [1024, 1024]
      benchmark::DoNotOptimize(at::mm(a, a));      // A^2
      benchmark::DoNotOptimize(at::mm(a, x));      // (bA + cA^2) X [1024, 4096]
    }
    const auto t2 = Clock::now();
    benchmark::DoNotOptimize(NewtonSchulz(x, hp.ns));
    const auto t3 = Clock::now();
    muon_s += Seconds(t0, t1);
    mm_s += Seconds(t1, t2);
    ns_s += Seconds(t2, t3);
    state.SetIterationTime(Seconds(t0, t1));
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["muon_ms"] = 1e3 * muon_s / n;
  state.counters["mm_ms"] = 1e3 * mm_s / n;
  state.counters["ns_ms"] = 1e3 * ns_s / n;
  state.counters["mm_fraction"] = mm_s / muon_s;
  state.counters["mm_over_ns"] = mm_s / ns_s;
  state.counters["threads"] = at::get_num_threads();
  state.SetLabel(state.range(0) == 0 ? "ns=bf16" : "ns=fp32");
  at::set_num_threads(default_threads);
}
BENCHMARK(BM_MuonStep)
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The elementwise part of a Muon step on the same 1024x4096 matrix: ATen's op sequence (momentum
// lerp_, Nesterov lerp, bf16 cast; decay mul_, add_ of the bf16 update) against the two fused
// passes that replace it (internal/fused_elementwise.h), same iteration, same threads.
void BM_MuonElementwise(benchmark::State& state) {
  const int64_t rows = 1024, cols = 4096;
  const MuonHyper hp;
  const at::Tensor param = at::randn({rows, cols}, at::kFloat);
  const at::Tensor grad = at::randn({rows, cols}, at::kFloat);
  const at::Tensor momentum = at::zeros_like(param);
  const at::Tensor update = at::randn({rows, cols}, at::kBFloat16);
  double aten_s = 0.0, fused_s = 0.0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    momentum.lerp_(grad, 1.0 - hp.momentum);
    benchmark::DoNotOptimize(at::lerp(grad, momentum, hp.momentum).to(at::kBFloat16));
    param.mul_(1.0 - 1e-3 * hp.weight_decay);
    param.add_(update, -1e-3);
    const auto t1 = Clock::now();
    benchmark::DoNotOptimize(
        internal::FusedMomentum(momentum, grad, hp.momentum, hp.nesterov, at::kBFloat16));
    internal::FusedDecayAdd(param, 1.0 - 1e-3 * hp.weight_decay, update, -1e-3);
    const auto t2 = Clock::now();
    aten_s += Seconds(t0, t1);
    fused_s += Seconds(t1, t2);
    state.SetIterationTime(Seconds(t1, t2));
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["aten_ms"] = 1e3 * aten_s / n;
  state.counters["fused_ms"] = 1e3 * fused_s / n;
  state.counters["speedup"] = aten_s / fused_s;
  state.counters["threads"] = at::get_num_threads();
}
BENCHMARK(BM_MuonElementwise)->UseManualTime()->Unit(benchmark::kMillisecond);

// AdamW's ATen op sequence (what AdamWUpdate runs when it cannot fuse) against FusedAdamW on the
// same fp32 tensors, same iteration, same threads. Arg: elements.
void BM_AdamWFused(benchmark::State& state) {
  const int64_t n = state.range(0);
  const at::Tensor param = at::randn({n}, at::kFloat);
  const at::Tensor grad = at::randn({n}, at::kFloat);
  const AdamWState aten = MakeAdamWState(param);
  const AdamWState fused = MakeAdamWState(param);
  AdamWState aten_fused = MakeAdamWState(param);
  AdamWHyper aten_fused_hp;
  aten_fused_hp.fused = true;
  internal::AdamWScalars s;
  s.apply_decay = true;
  s.decay = 1.0 - 1e-3 * 0.01;
  s.bias_correction2_sqrt = 0.5;
  double aten_s = 0.0, fused_s = 0.0, aten_fused_s = 0.0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    param.mul_(s.decay);
    aten.exp_avg.lerp_(grad, 1.0 - s.beta1);
    aten.exp_avg_sq.mul_(s.beta2).addcmul_(grad, grad, 1.0 - s.beta2);
    param.addcdiv_(aten.exp_avg,
                   at::div(aten.exp_avg_sq.sqrt(), s.bias_correction2_sqrt).add_(s.eps),
                   -s.step_size);
    const auto t1 = Clock::now();
    internal::FusedAdamW(param, grad, fused.exp_avg, fused.exp_avg_sq, s);
    const auto t2 = Clock::now();
    AdamWUpdate(param, grad, aten_fused, aten_fused_hp, 1e-3);
    const auto t3 = Clock::now();
    aten_s += Seconds(t0, t1);
    fused_s += Seconds(t1, t2);
    aten_fused_s += Seconds(t2, t3);
    state.SetIterationTime(Seconds(t1, t2));
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["aten_ms"] = 1e3 * aten_s / iters;
  state.counters["fused_ms"] = 1e3 * fused_s / iters;
  state.counters["speedup"] = aten_s / fused_s;
  state.counters["aten_fused_ms"] = 1e3 * aten_fused_s / iters;
  state.counters["aten_fused_speedup"] = aten_s / aten_fused_s;
  state.counters["threads"] = at::get_num_threads();
}
BENCHMARK(BM_AdamWFused)
    ->Arg(1 << 18)
    ->Arg(1 << 20)
    ->Arg(1 << 22)
    ->Arg(1 << 24)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_AdamWStep(benchmark::State& state) {
  const int64_t n = state.range(0);
  const at::Tensor param = at::randn({n}, at::kFloat);
  const at::Tensor grad = at::randn({n}, at::kFloat);
  const at::Tensor dst = at::empty_like(param);
  AdamWState adam = MakeAdamWState(param);
  const AdamWHyper hp;
  double adamw_s = 0.0, copy_s = 0.0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    AdamWUpdate(param, grad, adam, hp, 1e-3);
    const auto t1 = Clock::now();
    dst.copy_(grad);
    const auto t2 = Clock::now();
    adamw_s += Seconds(t0, t1);
    copy_s += Seconds(t1, t2);
    state.SetIterationTime(Seconds(t0, t1));
  }
  const double iters = static_cast<double>(state.iterations());
  const double bytes = 4.0 * static_cast<double>(n);
  state.counters["adamw_GBps"] = 7.0 * bytes * iters / adamw_s / 1e9;
  state.counters["copy_GBps"] = 2.0 * bytes * iters / copy_s / 1e9;
  state.counters["ratio"] = (7.0 * bytes / adamw_s) / (2.0 * bytes / copy_s);
  state.counters["threads"] = at::get_num_threads();
  state.SetBytesProcessed(static_cast<int64_t>(7.0 * bytes * iters));
}
BENCHMARK(BM_AdamWStep)->Arg(1 << 20)->Arg(1 << 24)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace orthoshard::optimizers
