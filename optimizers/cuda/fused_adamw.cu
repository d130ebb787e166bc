// AdamW per element, in torch.optim.AdamW(foreach=False) order (Loshchilov & Hutter, "Decoupled Weight
// Decay Regularization", Algorithm 2):
//   p  *= 1 - lr * wd
//   m  += (1 - beta1) * (g - m)                       (lerp)
//   v   = beta2 * v + (1 - beta2) * g * g
//   p  -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "optimizers/cuda/fused_adamw.h"

namespace orthoshard::optimizers::cuda {
namespace {

__device__ __forceinline__ float Bf16ToFloat(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t FloatToBf16(float value) {
  __nv_bfloat16 b = __float2bfloat16_rn(value);
  return *reinterpret_cast<uint16_t*>(&b);
}

__global__ void FusedAdamWKernel(FusedAdamWArgs args, float step_size, float bias_correction2_sqrt) {
  const float decay = 1.0f - args.lr * args.weight_decay;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < args.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = (args.grad_f32 != nullptr ? args.grad_f32[i] : Bf16ToFloat(args.grad_bf16[i])) *
                    args.grad_scale;
    float p = args.param[i] * decay;
    float m = args.exp_avg[i];
    m = m + (1.0f - args.beta1) * (g - m);
    const float v = args.exp_avg_sq[i] * args.beta2 + (1.0f - args.beta2) * g * g;
    const float denom = sqrtf(v) / bias_correction2_sqrt + args.eps;
    p = p - step_size * (m / denom);
    args.param[i] = p;
    args.exp_avg[i] = m;
    args.exp_avg_sq[i] = v;
    if (args.model_param_bf16 != nullptr) args.model_param_bf16[i] = FloatToBf16(p);
  }
}

}  // namespace

int LaunchFusedAdamW(const FusedAdamWArgs& args, void* stream) {
  if (args.n == 0) return 0;
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(args.beta1), args.step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(args.beta2), args.step);
  const float step_size = static_cast<float>(args.lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  constexpr int kThreads = 256;
  const int64_t wanted = (args.n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
  FusedAdamWKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args, step_size,
                                                                               bias_correction2_sqrt);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace orthoshard::optimizers::cuda
