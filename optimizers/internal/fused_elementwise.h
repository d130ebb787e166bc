// Fused CPU passes for the elementwise parts of Muon and AdamW steps, bitwise equal to the ATen ops
// they replace (lerp_ / lerp, to(bf16), mul_, add_ with alpha, addcmul_, div, add_, addcdiv_).
//
// ATen runs those ops as separate memory-bound passes over fp32 tensors, with full fp32
// temporaries in between (the Nesterov update, add_'s bf16 -> fp32 cast, AdamW's denominator).
// Here they are merged into as few passes as bitwise equality allows. It holds because every
// element goes through the same float operations as ATen's vectorised CPU kernels
// (aten/src/ATen/native/cpu/LerpKernel.cpp, PointwiseOpsKernel.cpp, ufunc/add.h): lerp as
// fma(w, end - start, start) for |w| < 0.5, else fma(w - 1, end - start, end); add as
// fma(other, alpha, self); addcmul as fma(value * t1, t2, self); addcdiv as self + (value * t1) / t2;
// scalars rounded to float first; bf16 rounded to nearest even. fma and / are correctly rounded
// whichever instruction computes them. ATen's CPU sqrt is not (about 0.5 % of fp32 results are one
// ulp off), so AdamW keeps ATen's sqrt as a pass of its own. //optimizers:fused_elementwise_test
// checks all of it against ATen on awkward sizes and values.
#ifndef ORTHOSHARD_OPTIMIZERS_INTERNAL_FUSED_ELEMENTWISE_H_
#define ORTHOSHARD_OPTIMIZERS_INTERNAL_FUSED_ELEMENTWISE_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace orthoshard::optimizers::internal {

// True when the CPU has AVX2 and FMA and ATen dispatches its kernels to its AVX2 or AVX-512 build
// (the capability it chose at start-up from the CPU and ATEN_CPU_CAPABILITY): there its vectorised
// kernels use fma, as the fused passes do. Elsewhere nothing is fused.
bool AtenKernelsUseFma();

// True when the fused passes below apply: AtenKernelsUseFma(), dense contiguous CPU tensors of one
// numel, fp32 momentum, grad and param, update fp32 or bf16; and mu != 0. ATen computes the last
// few elements of each thread's range with a scalar formula, end - (end - start) * (1 - w), which
// for w == 1 (mu == 0) gives a zero of the other sign than the vector formula; elsewhere the two
// agree bit for bit, so only mu == 0 would make the result depend on where those ranges end.
bool CanFuseMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu);
bool CanFuseDecayAdd(const at::Tensor& param, const at::Tensor& update);

// momentum.lerp_(grad, 1 - mu); returns (nesterov ? at::lerp(grad, momentum, mu) : momentum) as a
// new tensor of grad's shape in `out_type` (kFloat or kBFloat16).
// Precondition: CanFuseMomentum(momentum, grad, mu).
at::Tensor FusedMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu,
                         bool nesterov, at::ScalarType out_type);

// AdamW's scalars, computed in double exactly as AdamWUpdate (and torch/optim/adam.py) does.
struct AdamWScalars {
  bool apply_decay = false;  // weight_decay != 0: param.mul_(decay) first
  double decay = 1.0;        // 1 - lr * weight_decay
  double beta1 = 0.9;        // exp_avg.lerp_(grad, 1 - beta1)
  double beta2 = 0.999;      // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
  double bias_correction2_sqrt = 1.0;
  double eps = 1e-8;
  double step_size = 1e-3;   // lr / bias_correction1; param.addcdiv_(exp_avg, denom, -step_size)
};

// Below this many elements AdamWUpdate keeps ATen's ops: they run from cache there, and the fused
// version's per-block bookkeeping costs about what it saves (//optimizers:optimizers_benchmark,
// BM_AdamWFused: 0.78x at 2^18 elements, 0.87-2.2x at 2^20 depending on what else is in cache,
// 2.2x at 2^22, 2.1x at 2^24).
constexpr int64_t kFusedAdamWMinNumel = int64_t{1} << 21;

// True when FusedAdamW applies (at any size): AtenKernelsUseFma(), dense
// contiguous fp32 CPU tensors of one numel, no two the same, and beta1 != 0 (lerp weight 1: see
// CanFuseMomentum).
bool CanFuseAdamW(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, double beta1);

// One AdamW update (decoupled weight decay, no amsgrad): a pass for decay + both moments, ATen's
// sqrt of exp_avg_sq, and a pass for the denominator + addcdiv_; bitwise what AdamWUpdate's ATen
// ops produce. Precondition: CanFuseAdamW(...).
void FusedAdamW(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const AdamWScalars& scalars);

// param.mul_(decay); param.add_(update, alpha) with update fp32 or bf16.
// Precondition: CanFuseDecayAdd(param, update).
void FusedDecayAdd(const at::Tensor& param, double decay, const at::Tensor& update, double alpha);

}  // namespace orthoshard::optimizers::internal

#endif  // ORTHOSHARD_OPTIMIZERS_INTERNAL_FUSED_ELEMENTWISE_H_
