// QK-clip (MuonClip, Kimi K2, arXiv:2507.20534) in the training loop: --qk_clip_threshold=tau.
// Each step the model records every block's per-head largest attention logit over the step's
// micro-batches (Gpt::set_max_logit_record); before the optimizer step the ranks take the maximum
// over all of them (one MAX all-reduce of [L, H] floats), and each block whose KV groups went
// above tau gets row factors for its fused QKV weight (model/qk_clip.h: sqrt(tau / S_g) on the
// group's query and key rows) that the optimizer applies right after updating its part of that
// weight, on the fp32 main param, before the param sync (ChainedOptimizer::SetRowScales). So the
// clip acts on the updated weights (as Kimi and Megatron-LM apply it after the optimizer step) in
// every --dist mode and for either optimizer: with --dist=layerwise/fsdp on the rank that owns the
// Muon matrix, with ZeRO-1 AdamW on each rank's element range, with replicated on every rank.
//
// Cross-rank contract: every rank calls BeginStep and Prepare once per step in the same order;
// Prepare launches one all-reduce on the communicator.
#ifndef ORTHOSHARD_INTEGRATION_QK_CLIP_H_
#define ORTHOSHARD_INTEGRATION_QK_CLIP_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "model/model.h"
#include "optimizers/chained.h"

namespace orthoshard::integration {

// What one step's QK-clip saw and did, the same on every rank.
struct QkClipStats {
  double max_logit = 0;        // the largest logit of any block, head and rank (before clipping)
  int64_t clipped_groups = 0;  // KV groups (summed over blocks) whose query and key rows scale
};

class QkClip {
 public:
  // tau > 0; `model` must outlive this.
  QkClip(double tau, model::Gpt* model);

  // Before the step's first forward: resets the record to -inf and attaches it to the model, so
  // the step's forwards (not the evals between steps) are measured.
  void BeginStep();

  // After the step's last backward and before its optimizer step: detaches the record, takes its
  // maximum over `comm`'s ranks, and hands every block with a clipped group its QKV row factors
  // for the next step of `optimizer`. Errors: the communicator's; kInvalidArgument when the
  // optimizer does not know the model's qkv params.
  absl::StatusOr<QkClipStats> Prepare(collectives::Communicator& comm,
                                      optimizers::ChainedOptimizer& optimizer);

 private:
  double tau_;
  model::Gpt* model_;
  at::Tensor record_;  // [L, H] fp32 on the params' device
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_QK_CLIP_H_
