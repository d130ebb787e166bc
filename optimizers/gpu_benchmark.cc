// GPU figures for issue 11, printed as a Markdown section to paste into BENCHMARKS.md:
//   - Newton–Schulz in bf16 (NewtonSchulz, PyTorch's op order) at TFLOP/s next to plain bf16 at::mm
//     of the same shapes and count (5 x [X X^T, A A, B X]), same process, same device; goal >= 0.6.
//   - AdamWUpdate on fp32 CUDA tensors in bytes/s (the 7 passes of an ideal fused step) next to a
//     device-to-device copy of one tensor (2 passes); goal >= 0.5.
//
//   bazel build --config=cuda //optimizers:gpu_benchmark
//   bazel-bin/optimizers/gpu_benchmark [--iters=N]        (on a GPU machine, GPU 0)
//
// Built without --config=cuda it says so and exits 2. Not yet run: no GPU has been lent to this
// project's tasks (see README, "GPU").
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include "absl/strings/numbers.h"
#include "optimizers/adamw.h"
#include "optimizers/muon.h"

#ifdef ORTHOSHARD_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace orthoshard::optimizers {
namespace {

#ifdef ORTHOSHARD_CUDA
using Clock = std::chrono::steady_clock;

void Sync() { c10::cuda::device_synchronize(); }

// Mean seconds of `fn` over `iters` runs after 2 warm-up runs, the device synchronised around.
template <typename Fn>
double TimeIt(int iters, Fn fn) {
  for (int i = 0; i < 2; ++i) fn();
  Sync();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  Sync();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

int Run(int iters) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "gpu_benchmark: no CUDA device 0\n");
    return 2;
  }
  const at::TensorOptions f32 = at::TensorOptions(at::kFloat).device(at::kCUDA, 0);
  const at::TensorOptions bf16 = at::TensorOptions(at::kBFloat16).device(at::kCUDA, 0);
  std::printf("## GPU: %s\n\n", prop.name);
  std::printf("Reproduce: `bazel build --config=cuda //optimizers:gpu_benchmark && "
              "bazel-bin/optimizers/gpu_benchmark --iters=%d`\n\n", iters);

  std::printf("| Newton–Schulz bf16, 5 steps | NS ms | NS TFLOP/s | its at::mm ms | mm TFLOP/s | "
              "NS / mm |\n|---|---:|---:|---:|---:|---:|\n");
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1024, 4096}, {4096, 4096}, {4096, 14336}, {8192, 8192}};
  NewtonSchulzOptions ns;
  for (const auto& [rows, cols] : shapes) {
    const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
    const at::Tensor g = at::randn({rows, cols}, f32);
    const at::Tensor x = at::randn({m, n}, bf16);
    const at::Tensor a = at::randn({m, m}, bf16);
    const double ns_s = TimeIt(iters, [&] { (void)NewtonSchulz(g, ns); });
    const double mm_s = TimeIt(iters, [&] {
      for (int i = 0; i < ns.ns_steps; ++i) {
        (void)at::mm(x, x.t());
        (void)at::mm(a, a);
        (void)at::mm(a, x);
      }
    });
    const double flop = ns.ns_steps * (4.0 * m * m * n + 2.0 * m * m * m);
    std::printf("| %lldx%lld | %.3f | %.1f | %.3f | %.1f | %.3f |\n", static_cast<long long>(rows),
                static_cast<long long>(cols), 1e3 * ns_s, flop / ns_s / 1e12, 1e3 * mm_s,
                flop / mm_s / 1e12, mm_s / ns_s);
  }

  std::printf("\n| AdamW step fp32 | AdamW GB/s (7 passes) | D2D copy GB/s (2 passes) | "
              "AdamW / copy |\n|---|---:|---:|---:|\n");
  for (int64_t numel : {int64_t{1} << 24, int64_t{1} << 26}) {
    const at::Tensor param = at::randn({numel}, f32);
    const at::Tensor grad = at::randn({numel}, f32);
    const at::Tensor dst = at::empty_like(param);
    AdamWState state = MakeAdamWState(param);
    const AdamWHyper hp;
    const double adamw_s = TimeIt(iters, [&] { AdamWUpdate(param, grad, state, hp, 1e-3); });
    const double copy_s = TimeIt(iters, [&] { dst.copy_(grad); });
    const double bytes = 4.0 * static_cast<double>(numel);
    std::printf("| %lld (%.0f MiB) | %.1f | %.1f | %.3f |\n", static_cast<long long>(numel),
                bytes / (1 << 20), 7.0 * bytes / adamw_s / 1e9, 2.0 * bytes / copy_s / 1e9,
                (7.0 * bytes / adamw_s) / (2.0 * bytes / copy_s));
  }
  return 0;
}
#endif

int Main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const char* kIters = "--iters=";
    if (std::strncmp(argv[i], kIters, std::strlen(kIters)) != 0 ||
        !absl::SimpleAtoi(argv[i] + std::strlen(kIters), &iters) || iters < 1) {
      std::fprintf(stderr, "gpu_benchmark: unknown or bad argument '%s'; expected --iters=N >= 1\n",
                   argv[i]);
      return 2;
    }
  }
#ifdef ORTHOSHARD_CUDA
  return Run(iters);
#else
  std::fprintf(stderr,
               "gpu_benchmark: built without CUDA; build it with `bazel build --config=cuda "
               "//optimizers:gpu_benchmark` and run it on a GPU machine\n");
  return 2;
#endif
}

}  // namespace
}  // namespace orthoshard::optimizers

int main(int argc, char** argv) { return orthoshard::optimizers::Main(argc, argv); }
