// Fused CPU passes for the elementwise parts of a Muon step, bitwise equal to the ATen ops they
// replace (at::lerp_ / at::lerp, Tensor::to(bf16), Tensor::mul_ then Tensor::add_ with alpha).
//
// ATen runs those ops as separate memory-bound passes over fp32 tensors, with a full fp32
// temporary for the Nesterov update and another for add_'s bf16 -> fp32 cast. Here each group is
// one pass that reads each input once. Bitwise equality holds because every element goes through
// the same float operations as ATen's vectorised CPU kernels (aten/src/ATen/native/cpu/
// LerpKernel.cpp, ufunc/add.h): lerp as fma(w, end - start, start) for |w| < 0.5, else
// fma(w - 1, end - start, end); add as fma(other, alpha, self); scalars rounded to float first;
// bf16 rounded to nearest even. An fma is correctly rounded whichever instruction computes it.
// //optimizers:muon_elementwise_test checks all of it against ATen on awkward sizes and values.
#ifndef ORTHOSHARD_OPTIMIZERS_INTERNAL_MUON_ELEMENTWISE_H_
#define ORTHOSHARD_OPTIMIZERS_INTERNAL_MUON_ELEMENTWISE_H_

#include <ATen/core/Tensor.h>

namespace orthoshard::optimizers::internal {

// True when the fused passes below apply: a CPU with AVX2 and FMA (where ATen's vectorised kernels
// use fma too), dense contiguous CPU tensors of one numel, fp32 momentum, grad and param, update
// fp32 or bf16; and mu != 0. ATen computes the last few elements
// of each thread's range with a scalar formula, end - (end - start) * (1 - w), which for w == 1
// (mu == 0) gives a zero of the other sign than the vector formula; elsewhere the two agree bit for
// bit, so only mu == 0 would make the result depend on where those ranges end.
bool CanFuseMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu);
bool CanFuseDecayAdd(const at::Tensor& param, const at::Tensor& update);

// momentum.lerp_(grad, 1 - mu); returns (nesterov ? at::lerp(grad, momentum, mu) : momentum) as a
// new tensor of grad's shape in `out_type` (kFloat or kBFloat16).
// Precondition: CanFuseMomentum(momentum, grad, mu).
at::Tensor FusedMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu,
                         bool nesterov, at::ScalarType out_type);

// param.mul_(decay); param.add_(update, alpha) with update fp32 or bf16.
// Precondition: CanFuseDecayAdd(param, update).
void FusedDecayAdd(const at::Tensor& param, double decay, const at::Tensor& update, double alpha);

}  // namespace orthoshard::optimizers::internal

#endif  // ORTHOSHARD_OPTIMIZERS_INTERNAL_MUON_ELEMENTWISE_H_
