// Activation recompute (gradient checkpointing, as Megatron-LM's CheckpointFunction): a piece of the
// forward runs without keeping its activations, and backward runs it again to get them.
//
//   outputs = Recompute(fn, inputs, params)
//     forward:  fn(inputs', params', /*recomputing=*/false), where inputs' and params' are
//               detached aliases of the same tensors (requires_grad where the originals do), in
//               grad mode (so that ATen picks the same kernels as the recompute and as a run
//               without recompute); its graph is dropped with the aliases, and only `inputs` are
//               kept
//     backward: fn(inputs', params', /*recomputing=*/true) on fresh aliases in grad mode, then ONE
//               torch::autograd::grad of the outputs (those whose gradient is defined) with
//               respect to inputs' and params'; the result is this node's gradient for `inputs`
//               and `params`.
//
// The params are inputs of the autograd node, so their gradient accumulators (and the hooks a
// data-parallel wrapper puts on them: ddp/) stay in the outer graph and run once, after this node,
// exactly as without recompute. The inner autograd::grad differentiates detached aliases, which
// have no hooks and no accumulator of their own: no hook of the outer graph runs inside the nested
// graph task, and nothing is queued on it (ddp's queue_callback would otherwise attach to the
// nested task and run at its end). The aliases share the params' storage as it is when backward
// runs, so a ZeRO-3 wrapper that gathers a layer's params in a hook on this node's output
// gradients (ddp's pre-backward hook on the layer's output) is read by the recompute with one
// gather.
//
// Bitwise: the recompute runs the same ops on the same values as the forward, and the gradients are
// computed by the same backward ops in the same order as they would be without recompute (the
// nested graph is the same subgraph; the engine orders it by the same creation order). It relies on
// fn being deterministic (no dropout: there is no RNG state to restore); model/recompute_test.cc
// checks the GPT's blocks.
//
// Collectives inside fn (tensor-parallel all-reduces, MoE all-to-alls) run again in backward: every
// rank of the group must recompute the same pieces in the same order, which it does when all ranks
// run the same model with the same recompute settings. An error thrown by fn in backward propagates
// out of backward as a c10::Error.
#ifndef ORTHOSHARD_MODEL_RECOMPUTE_H_
#define ORTHOSHARD_MODEL_RECOMPUTE_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace orthoshard::model {

// A recomputable piece of the forward: outputs from `inputs` and `params` (defined tensors). It is
// called once in forward (recomputing = false) and once more in backward (recomputing = true),
// where it must compute the same values and should not record side results again (statistics that
// the forward already recorded). It must return the same number of defined outputs both times. A
// statistic it records in forward is computed in grad mode: record it under no-grad (detached).
using RecomputeFn = std::function<std::vector<at::Tensor>(
    const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
    bool recomputing)>;

// fn's outputs, differentiable in `inputs` and `params` (defined floating-point tensors; `params`
// are typically leaves). Without grad mode, or when nothing requires grad, fn runs once and
// nothing is kept. The inputs must not be modified in place between forward and backward (the
// saved-tensor version check fails backward otherwise); the params' values must be the same when
// backward runs (their storage may be swapped, as ZeRO-3 does).
std::vector<at::Tensor> Recompute(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& params);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_RECOMPUTE_H_
