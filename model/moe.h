// The mixture-of-experts MLP of a Gpt block (GptConfig::num_experts > 0), with expert parallelism.
//
//   m [B, T, C] -> router logits z = m R^T [N, E] (fp32) -> p = softmax(z) -> the top-k experts
//   of each token, weights p_top / sum(p_top) (Mixtral's routing; Qwen2-MoE's with
//   norm_topk_prob) -> each token's k copies go to their experts, out = sum_i w_i expert_i(m)
//   (+ sigmoid(m g^T) * shared(m) with a shared expert).
//
// Dropless: every expert takes every token routed to it (no capacity factor). Each expert is a
// SwiGLU MLP (fc1 [2 F_e, C] = [gate; up], fc2 [C, F_e]) computed over the rows routed to it:
// one product per expert over its contiguous rows (a grouped product by loop).
//
// Expert parallelism: the E experts are split evenly over the ep group, rank r holding experts
// [r E/ep, (r+1) E/ep). Dispatch: the token copies are sorted by expert (stable: by expert, then
// token, then choice), each rank tells every other how many rows it sends to each of that rank's
// experts (an all-to-all of E int64 counts), and the rows move by one all-to-all with uneven
// splits; the received rows are grouped per local expert (sources in rank order), computed, and
// sent back by the reverse all-to-all (combine). Backward: the same two all-to-alls with the
// splits swapped (AllToAllFunction). With ep 1 there is no collective and no copy.
//
// Auxiliary losses (per layer, this rank's tokens; the trainer weighs and adds them):
//   load balance (Switch Transformer / GShard): E * sum_e f_e P_e, f_e the fraction of the N k
//     token copies routed to e (no gradient), P_e the mean router probability of e;
//   router z-loss (ST-MoE): mean over tokens of logsumexp(z)^2.
#ifndef ORTHOSHARD_MODEL_MOE_H_
#define ORTHOSHARD_MODEL_MOE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "model/gpt_config.h"

namespace orthoshard::model {

// The expert-parallel group a model's experts are split over.
struct ExpertParallel {
  collectives::Communicator* comm = nullptr;  // the ep group; null: this rank holds every expert

  int rank() const { return comm != nullptr ? comm->rank() : 0; }
  int size() const { return comm != nullptr ? comm->size() : 1; }
};

// One MoE layer's weights as this rank holds them.
struct MoeWeights {
  at::Tensor router;                 // [E, C]
  std::vector<at::Tensor> fc1, fc2;  // this rank's E / ep experts, in global order
  at::Tensor shared_fc1, shared_fc2, shared_gate;  // [2 F_s, C], [C, F_s], [1, C]; or undefined
};

// What one MoE layer's forward records.
struct MoeAux {
  at::Tensor load_balance;       // fp32 scalar in the autograd graph (see the file comment)
  at::Tensor z_loss;             // fp32 scalar in the autograd graph
  at::Tensor tokens_per_expert;  // [E] int64: this rank's token copies routed to each expert
  at::Tensor top_experts;        // [N, k] int64: each token's experts, most probable first
};

// The MoE MLP of m [B, T, C] (the block's normed input): [B, T, C]. Every rank of `ep` must call it
// for the same layer in the same order (the all-to-alls are collectives). A failed collective is
// stored in *error (the first one kept) and thrown as a c10::Error whose message carries it.
at::Tensor MoeMlp(const GptConfig& config, const MoeWeights& weights, const ExpertParallel& ep,
                  const at::Tensor& m, MoeAux* aux, absl::Status* error);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_MOE_H_
