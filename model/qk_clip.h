// QK-clip (MuonClip, Kimi K2, arXiv:2507.20534 section 2.2): the model's part. After an optimizer
// step, the query and key weights of an attention head whose pre-softmax logits grew beyond a
// threshold tau are scaled down so that the same inputs would give logits of at most tau. Here:
// measuring each head's largest logit during a forward (MaxAttentionLogits, which Gpt runs when a
// record is set: Gpt::set_max_logit_record), and the per-row factors of a block's fused QKV weight
// that the optimizer then applies (QkClipRowScales, for optimizers::ChainedOptimizer::SetRowScales).
// The cross-rank maximum and the hand-over to the optimizer are the trainer's
// (integration/qk_clip.h).
//
// Granularity: per KV group, as Megatron-LM's qk_clip for grouped-query attention. The R = H / KV
// query heads of group g share its key head, so a key row cannot be scaled for one head alone:
// S_g = max over the group's heads of S_h, gamma_g = min(1, tau / S_g), and the group's query rows
// and key rows are both scaled by sqrt(gamma_g) (alpha = 0.5: Kimi's and Megatron's default), so
// every logit of the group's heads scales by exactly gamma_g (rotary is linear). With KV == H
// (plain multi-head attention) this is Kimi's per-head rule. Heads that share a key with a clipped
// head are scaled with it; groups with S_g <= tau are untouched (factor exactly 1).
#ifndef ORTHOSHARD_MODEL_QK_CLIP_H_
#define ORTHOSHARD_MODEL_QK_CLIP_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "common/tp_split.h"
#include "model/gpt_config.h"

namespace orthoshard::model {

// Logits computed per block of MaxAttentionLogits (16 MiB of fp32): the extra memory it needs.
inline constexpr int64_t kMaxLogitBlockElements = int64_t{1} << 22;

// The largest pre-softmax attention logit of each query head h: the max over rows b, query
// positions i and the key positions j that i attends of q[b, h, i] . k[b, h / R, j] / sqrt(D), the
// logit the attention kernel sees (after rotary). q [B, H, T, D], k [B, KV, T, D] (H a multiple of
// KV, R = H / KV), any floating dtype, computed in fp32 under no-grad in blocks of at most
// `block_elements` (> 0) logits, or one query position of every head (a test makes blocks small to
// cover the blocking); `mask` [B, 1, T, T] bool (true: may attend), or undefined for causal
// attention. Returns fp32 [H] on q's device (-inf for a head that attends nothing).
at::Tensor MaxAttentionLogits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask,
                              int64_t block_elements = kMaxLogitBlockElements);

// The factors of the rows of one block's fused QKV weight [(H + 2 KV) D, C] (per group g: its
// R = H / KV query heads, its key head, its value head, D rows each) for that block's per-head
// maxima `max_logits` [H] (any floating dtype and device) and threshold tau > 0: sqrt(gamma_g) for
// the query and key rows of group g, 1 for its value rows (see the file comment). gamma_g is
// computed in double from the fp32 maxima; a group whose maximum is not above tau (NaN included)
// gets exactly 1. Returns fp32 [(H + 2 KV) D] on the CPU. Sets *clipped_groups (when not null) to
// the number of groups scaled.
// Tensor parallelism: with `tp` the QKV weight's split (ModelParam::tp: dim 0, 1 part, rank r of
// size tp), the factors of this rank's shard only, [(H + 2 KV) D / tp]: the rows of KV groups
// [r KV / tp, (r + 1) KV / tp), read from those groups' heads of the (global) `max_logits`, the
// other heads' entries unread; *clipped_groups then counts this shard's groups.
// Precondition: ValidateConfig(config) is OK, tau > 0; a split `tp` is dim 0, 1 part, and its
// size divides num_kv_heads.
at::Tensor QkClipRowScales(const GptConfig& config, const at::Tensor& max_logits, double tau,
                           int64_t* clipped_groups = nullptr, const TpSplit& tp = {});

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_QK_CLIP_H_
