// Checks the fused AdamW kernel against a host implementation of the same per-element math over
// several steps, with fp32 and bf16 gradients. Needs a GPU: built only under --config=cuda (the
// target is tagged manual), and skips when no device is visible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "optimizers/cuda/fused_adamw.h"

namespace orthoshard::optimizers::cuda {
namespace {

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even, as __float2bfloat16_rn
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

void HostAdamW(std::vector<float>& p, std::vector<float>& m, std::vector<float>& v,
               const std::vector<float>& g, const FusedAdamWArgs& a) {
  const float step_size = static_cast<float>(a.lr / (1.0 - std::pow(double{a.beta1}, a.step)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double{a.beta2}, a.step)));
  for (size_t i = 0; i < p.size(); ++i) {
    const float gi = g[i] * a.grad_scale;
    p[i] *= 1.0f - a.lr * a.weight_decay;
    m[i] = m[i] + (1.0f - a.beta1) * (gi - m[i]);
    v[i] = v[i] * a.beta2 + (1.0f - a.beta2) * gi * gi;
    p[i] = p[i] - step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + a.eps));
  }
}

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* ptr = nullptr;
  EXPECT_EQ(cudaMalloc(&ptr, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return ptr;
}

template <typename T>
std::vector<T> HostCopy(const T* ptr, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

class FusedAdamWTest : public ::testing::TestWithParam<bool> {};

TEST_P(FusedAdamWTest, MatchesHostReferenceOverSteps) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const bool bf16_grad = GetParam();
  constexpr int64_t kN = 100003;  // odd size: exercises the grid-stride tail
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> p(kN), m(kN, 0.0f), v(kN, 0.0f);
  for (float& x : p) x = normal(rng);
  float* d_p = DeviceCopy(p);
  float* d_m = DeviceCopy(m);
  float* d_v = DeviceCopy(v);
  std::vector<uint16_t> model(kN);
  uint16_t* d_model = DeviceCopy(model);
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<float> g(kN);
    std::vector<uint16_t> g16(kN);
    for (int64_t i = 0; i < kN; ++i) {
      g16[i] = FloatToBf16(normal(rng));
      g[i] = bf16_grad ? Bf16ToFloat(g16[i]) : normal(rng);
    }
    FusedAdamWArgs args;
    args.param = d_p;
    args.exp_avg = d_m;
    args.exp_avg_sq = d_v;
    float* d_g = nullptr;
    uint16_t* d_g16 = nullptr;
    if (bf16_grad) {
      d_g16 = DeviceCopy(g16);
      args.grad_bf16 = d_g16;
    } else {
      d_g = DeviceCopy(g);
      args.grad_f32 = d_g;
    }
    args.model_param_bf16 = d_model;
    args.n = kN;
    args.lr = 1e-2f;
    args.weight_decay = 0.1f;
    args.grad_scale = 0.5f;
    args.step = step;
    ASSERT_EQ(LaunchFusedAdamW(args, nullptr), 0);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    HostAdamW(p, m, v, g, args);
    cudaFree(d_g);
    cudaFree(d_g16);
  }
  const std::vector<float> got = HostCopy(d_p, kN);
  const std::vector<uint16_t> got_model = HostCopy(d_model, kN);
  // Kernel and HostAdamW run the same float operations in the same order; only nvcc's
  // contraction of a * b + c into fma (on by default; the host build has no FMA) may drop
  // roundings: in the decay factor, the m and v updates and p - step_size * (m / denom). Those in
  // m and v (carried over the steps) move Delta_t = step_size * m / denom by at most ~16 * 2^-24
  // relative, and |Delta_t| <= ~1.01 lr for t <= 4 (Cauchy-Schwarz on the bias-corrected
  // moments). A p that already differs may round to a neighbouring float at p * decay and at
  // p - Delta_t: at most 2 ulp(p) <= 2^-22 |p| a step, 1 ulp at step 1 where p is still equal.
  // Over the 4 steps: 7 ulp(p) <= 14 * 2^-24 |p|, plus 16 * 2^-24 * 4.04 lr < 2^-24 (lr = 1e-2).
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(got[i], p[i], 0x1p-24f * (1.0f + 14.0f * std::fabs(p[i]))) << "element " << i;
    ASSERT_EQ(got_model[i], FloatToBf16(got[i])) << "element " << i;
  }
  cudaFree(d_p);
  cudaFree(d_m);
  cudaFree(d_v);
  cudaFree(d_model);
}

INSTANTIATE_TEST_SUITE_P(GradDtype, FusedAdamWTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "bf16" : "fp32"; });

}  // namespace
}  // namespace orthoshard::optimizers::cuda
