// Gpt's activation recompute (model.h, RecomputeConfig): which blocks run under Recompute and how
// a block is rerun in backward.
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/model.h"
#include "model/recompute.h"

namespace orthoshard::model {
namespace {

// Calls fn on every tensor slot of a layer, in one fixed order (undefined ones included).
template <typename Layer>
void VisitLayer(Layer& layer, const std::function<void(at::Tensor&)>& fn) {
  for (at::Tensor* t : {&layer.attn_norm, &layer.qkv, &layer.proj, &layer.mlp_norm, &layer.fc1,
                        &layer.fc2, &layer.moe.router}) {
    fn(*t);
  }
  for (auto* list : {&layer.moe.fc1, &layer.moe.fc2}) {
    for (at::Tensor& t : *list) fn(t);
  }
  for (at::Tensor* t : {&layer.moe.shared_fc1, &layer.moe.shared_fc2, &layer.moe.shared_gate}) {
    fn(*t);
  }
}

}  // namespace

absl::Status Gpt::set_recompute(const RecomputeConfig& recompute) {
  if (recompute.layers < -1 || recompute.layers > config_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gpt: recompute layers must be -1 (every block) or in [0, ",
                     config_.num_layers, "] (the model's blocks), got ", recompute.layers));
  }
  recompute_ = recompute;
  return absl::OkStatus();
}

std::vector<at::Tensor> Gpt::LayerTensors(const Layer& layer) {
  std::vector<at::Tensor> tensors;
  Layer copy = layer;
  VisitLayer(copy, [&](at::Tensor& t) {
    if (t.defined()) tensors.push_back(t);
  });
  return tensors;
}

Gpt::Layer Gpt::WithTensors(const Layer& layer, const std::vector<at::Tensor>& tensors) {
  Layer copy = layer;
  size_t next = 0;
  VisitLayer(copy, [&](at::Tensor& t) {
    if (t.defined()) t = tensors.at(next++);
  });
  return copy;
}

at::Tensor Gpt::RunBlock(size_t i, const at::Tensor& x, const AttentionInputs& attention) const {
  MoeAux* aux = config_.is_moe() ? &moe_aux_.emplace_back() : nullptr;
  const bool selected = recompute_.layers < 0 || i < static_cast<size_t>(recompute_.layers);
  const RecomputeGranularity granularity =
      selected ? recompute_.granularity : RecomputeGranularity::kNone;
  if (granularity != RecomputeGranularity::kFull) {
    return Block(layers_[i], x, attention,
                 BlockRun{aux, /*record=*/true,
                          /*recompute_attention=*/granularity == RecomputeGranularity::kSelective});
  }
  // Full: the block's output (and an MoE block's two aux losses, which get gradients too). The
  // forward run reads the layer's params themselves (in grad mode as without recompute; Recompute
  // drops its graph) and records (max logits under no-grad, the MoE aux of this forward); the
  // rerun in backward reads the params' detached aliases and records into a scratch MoeAux it
  // drops. `aux` (an element of
  // moe_aux_, which later blocks may reallocate) is only written by the forward run, inside
  // Recompute below.
  const RecomputeFn block = [this, i, attention, aux](const std::vector<at::Tensor>& inputs,
                                                      const std::vector<at::Tensor>& params,
                                                      bool recomputing) {
    MoeAux scratch;
    MoeAux* run_aux = aux == nullptr ? nullptr : recomputing ? &scratch : aux;
    const at::Tensor y =
        recomputing
            ? Block(WithTensors(layers_[i], params), inputs[0], attention,
                    BlockRun{run_aux, /*record=*/false})
            : Block(layers_[i], inputs[0], attention, BlockRun{run_aux, /*record=*/true});
    if (run_aux == nullptr) return std::vector<at::Tensor>{y};
    return std::vector<at::Tensor>{y, run_aux->load_balance, run_aux->z_loss};
  };
  std::vector<at::Tensor> outputs = Recompute(block, {x}, LayerTensors(layers_[i]));
  if (aux != nullptr) {
    aux->load_balance = outputs[1];  // in the autograd graph, through the recompute
    aux->z_loss = outputs[2];
  }
  return outputs[0];
}

}  // namespace orthoshard::model
