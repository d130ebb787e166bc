// SwiGluIn (swiglu.h).
#include "model/swiglu.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace orthoshard::model {
namespace {

// SiLU(m Wg^T) * (m Wu^T) for fc1 = [Wg; Wu] ([2F, C], gate rows then up rows): fc1's matrix product
// and the SwiGLU in one autograd function. The forward runs gate and up as two products with the
// contiguous row halves of fc1, as a model with separate gate and up Linears does: on a CPU with a
// 1 MB L2 the [.., 2F] product of `small` (a 1.4 MB weight) ran at 56 GFLOP/s where the halves'
// products run at 64 (bench/trace_ops.py). The backward writes both halves' gradients into one
// [.., 2F] tensor with the element-wise ops autograd would run for silu(gate) * up (MulBackward:
// da * up and da * silu(gate); SiluBackward: silu_backward), then takes fc1's and the input's
// gradients as one product each, exactly as at::linear's backward over the fused output (splitting
// those into halves too was slower: two more products and an add). Measured against at::linear +
// a SwiGLU over narrowed halves of its output (`small`, distopt AdamW, 2 ranks x 4 x 256 tokens,
// 7 A/B pairs in both orders): forward ~15 ms (10%) shorter per step, CPU per step 1-13% less in
// all 7, the same loss.
// The forward is the same per-element reductions (only the products' N is split), the backward
// the same ops.
struct GatedMlpIn : public torch::autograd::Function<GatedMlpIn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& m,
                            const at::Tensor& fc1) {
    const int64_t f = fc1.size(0) / 2;
    const at::Tensor m2 = m.reshape({-1, m.size(-1)});
    const at::Tensor gate = at::mm(m2, fc1.narrow(0, 0, f).t());
    const at::Tensor up = at::mm(m2, fc1.narrow(0, f, f).t());
    const at::Tensor activated = at::silu(gate);
    ctx->save_for_backward({m2, fc1, gate, up, activated});
    ctx->saved_data["m_sizes"] = m.sizes().vec();
    std::vector<int64_t> out_sizes = m.sizes().vec();
    out_sizes.back() = f;
    return (activated * up).view(out_sizes);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& m2 = saved[0];
    const at::Tensor& fc1 = saved[1];
    const at::Tensor& gate = saved[2];
    const at::Tensor& up = saved[3];
    const at::Tensor& activated = saved[4];
    const int64_t f = fc1.size(0) / 2;
    const at::Tensor da = grads[0].reshape({-1, f});
    at::Tensor d = at::empty({da.size(0), 2 * f}, da.options());
    at::Tensor d_gate = d.narrow(1, 0, f), d_up = d.narrow(1, f, f);
    at::mul_out(d_up, da, activated);
    at::silu_backward_out(d_gate, da * up, gate);
    at::Tensor d_m, d_fc1;
    if (ctx->needs_input_grad(0)) {
      d_m = at::mm(d, fc1).view(ctx->saved_data["m_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) d_fc1 = at::mm(d.t(), m2);
    return {d_m, d_fc1};
  }
};

}  // namespace

at::Tensor SwiGluIn(const at::Tensor& m, const at::Tensor& fc1) { return GatedMlpIn::apply(m, fc1); }

}  // namespace orthoshard::model
