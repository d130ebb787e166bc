// Recompute (recompute.h): the autograd function that reruns a piece of the forward in backward.
#include "model/recompute.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace orthoshard::model {
namespace {

// What backward needs besides the saved inputs: fn, the params (the model's own tensors: their
// storage as it is when backward runs) and which tensors required grad in forward.
struct RecomputeSpec : public torch::CustomClassHolder {
  RecomputeFn fn;
  size_t num_inputs = 0;
  std::vector<at::Tensor> params;
  std::vector<bool> requires_grad;  // [num_inputs + params.size()]
};

// A detached alias of t (the same storage), differentiable when `requires_grad`.
at::Tensor Alias(const at::Tensor& t, bool requires_grad) {
  at::Tensor alias = t.detach();
  if (requires_grad) alias.requires_grad_(true);
  return alias;
}

// Alias of each of `tensors`, differentiable where requires_grad[first + i].
std::vector<at::Tensor> Aliases(const std::vector<at::Tensor>& tensors,
                                const std::vector<bool>& requires_grad, size_t first) {
  std::vector<at::Tensor> aliases;
  for (size_t i = 0; i < tensors.size(); ++i) {
    aliases.push_back(Alias(tensors[i], requires_grad[first + i]));
  }
  return aliases;
}

// Autograd inputs: the spec (not a tensor), then the inputs and the params as one list.
struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<RecomputeSpec>& spec,
                                                at::TensorList tensors) {
    const std::vector<at::Tensor> inputs(tensors.begin(), tensors.begin() + spec->num_inputs);
    // fn runs in grad mode on detached aliases, as the recompute will, and its graph is dropped
    // with the aliases: ATen may pick kernels by grad mode or requires_grad (matmul folds a
    // batched input when an operand requires grad; CUDA's attention backends check it), so a
    // no-grad forward is not the same ops by construction. The transient graph holds one
    // piece's activations at a time, as the recompute in backward does.
    std::vector<at::Tensor> outputs;
    {
      at::AutoGradMode grad_mode(true);
      outputs = spec->fn(Aliases(inputs, spec->requires_grad, 0),
                         Aliases(spec->params, spec->requires_grad, spec->num_inputs),
                         /*recomputing=*/false);
    }
    for (at::Tensor& output : outputs) output = output.detach();
    ctx->save_for_backward(inputs);
    ctx->saved_data["spec"] = at::IValue::make_capsule(spec);
    // An output whose gradient never arrives (an aux loss the caller does not use) stays out of
    // the recomputed graph's roots, as it is out of the graph without recompute: no zeros added.
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto spec =
        c10::static_intrusive_pointer_cast<RecomputeSpec>(ctx->saved_data["spec"].toCapsule());
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const std::vector<at::Tensor> inputs = Aliases(saved, spec->requires_grad, 0);
    const std::vector<at::Tensor> params =
        Aliases(spec->params, spec->requires_grad, spec->num_inputs);
    std::vector<at::Tensor> wrt;
    std::vector<size_t> wrt_index;  // position in the gradient list (after the spec's slot)
    for (size_t i = 0; i < inputs.size() + params.size(); ++i) {
      const at::Tensor& t = i < inputs.size() ? inputs[i] : params[i - inputs.size()];
      if (!t.requires_grad()) continue;
      wrt.push_back(t);
      wrt_index.push_back(i);
    }
    torch::autograd::variable_list result(1 + inputs.size() + params.size());
    std::vector<at::Tensor> outputs;
    {
      at::AutoGradMode grad_mode(true);
      outputs = spec->fn(inputs, params, /*recomputing=*/true);
    }
    TORCH_CHECK(outputs.size() == grads.size(), "Recompute: the recomputed piece returned ",
                outputs.size(), " outputs, the forward ", grads.size());
    torch::autograd::variable_list roots, root_grads;
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (!grads[o].defined() || !outputs[o].requires_grad()) continue;
      roots.push_back(outputs[o]);
      root_grads.push_back(grads[o]);
    }
    if (roots.empty() || wrt.empty()) return result;
    const torch::autograd::variable_list wrt_grads =
        torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t w = 0; w < wrt.size(); ++w) result[1 + wrt_index[w]] = wrt_grads[w];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> Recompute(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& params) {
  bool any_requires_grad = false;
  for (const auto* list : {&inputs, &params}) {
    for (const at::Tensor& t : *list) any_requires_grad |= t.requires_grad();
  }
  if (!at::GradMode::is_enabled() || !any_requires_grad) return fn(inputs, params, false);
  auto spec = c10::make_intrusive<RecomputeSpec>();
  spec->fn = fn;
  spec->num_inputs = inputs.size();
  spec->params = params;
  for (const auto* list : {&inputs, &params}) {
    for (const at::Tensor& t : *list) spec->requires_grad.push_back(t.requires_grad());
  }
  std::vector<at::Tensor> tensors = inputs;
  tensors.insert(tensors.end(), params.begin(), params.end());
  return RecomputeFunction::apply(spec, at::TensorList(tensors));
}

}  // namespace orthoshard::model
