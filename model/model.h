// A GPT decoder on LibTorch, written with plain ATen ops over leaf tensors (no torch::nn; one custom
// autograd function, SwiGLU over the fused gate/up output, so its backward fills one gradient).
//
//   tokens [B, T] -> embedding -> L x Block -> final RMSNorm -> output head -> logits [B, T, V]
//   Block(x):  x = x + Proj(Attention(Rotary(QKV(RMSNorm(x)))))      causal, grouped-query
//              x = x + Down(SiLU(Gate(RMSNorm(x))) * Up(RMSNorm(x)))  SwiGLU
//
// Mixed precision: with bf16 params the activations are bf16 too, and the numerically sensitive
// parts run in fp32 as mixed-precision training does: ATen's bf16 RMSNorm and CPU/CUDA attention
// accumulate in fp32 and round once at the end (model_test checks the RMSNorm claim on the
// machine), and the loss is the cross entropy of the logits cast to fp32. The rotary tables are in
// the params' dtype (as Megatron-LM casts cos/sin to the activations' dtype).
//
// Params are fp32 (bf16 for mixed precision, fp64 for gradient checks) leaves with requires_grad,
// listed in a fixed order with a role (for optimizer routing) and, for fused weights, a split into
// logical blocks (for Muon):
//   embedding.weight                [V, C]                          embedding
//   layers.{i}.attn_norm.weight     [C]                             norm
//   layers.{i}.attn.qkv.weight      [(H + 2*KV) * D, C]             hidden; KV groups of {H/KV*D,
//   D, D} layers.{i}.attn.proj.weight     [C, H * D]                      hidden
//   layers.{i}.mlp_norm.weight      [C]                             norm
//   layers.{i}.mlp.fc1.weight       [2 * F, C]                      hidden; 1 group of {F, F}
//   (gate, up) layers.{i}.mlp.fc2.weight       [C, F]                          hidden
// An MoE model (GptConfig::num_experts E > 0, model/moe.h) has, in place of mlp.fc1 and mlp.fc2:
//   layers.{i}.mlp.router.weight                 [E, C]           router
//   layers.{i}.mlp.experts.{e}.fc1.weight        [2 * F_e, C]     hidden, expert e; {F_e, F_e}
//   layers.{i}.mlp.experts.{e}.fc2.weight        [C, F_e]         hidden, expert e
//   layers.{i}.mlp.shared_expert.fc1.weight      [2 * F_s, C]     hidden; {F_s, F_s} (if F_s > 0)
//   layers.{i}.mlp.shared_expert.fc2.weight      [C, F_s]         hidden
//   layers.{i}.mlp.shared_expert_gate.weight     [1, C]           router
// With expert parallelism (ExpertParallel of size ep) a rank holds only its E / ep experts,
// e in [r E / ep, (r + 1) E / ep), under their global names; every other param is on every rank.
//   final_norm.weight               [C]                             norm
//   output_layer.weight             [V, C]                          output (absent when tied)
// The fused QKV rows are ordered per query group g (Megatron's layout): the H/KV query heads of the
// group, then its key head, then its value head, each D rows. Query head h uses group h / (H/KV).
//
// Tensor parallelism (TensorParallel of size tp > 1, model/tensor_parallel.h; Megatron-LM's layout,
// checked by ValidateTensorParallel): each rank holds its slice of every split param under the
// param's global name (ModelParam::tp says which; common/tp_split.h), and a TP model's params are
// bitwise slices of the tp-1 model's of the same seed. Local shapes (G = KV / tp groups, each of
// R = H / KV query heads, a key and a value head; Vl = V / tp):
//   embedding.weight                [Vl, C]               dim 0: vocab ids [r Vl, (r+1) Vl)
//   layers.{i}.attn.qkv.weight      [(H + 2 KV) D / tp, C] dim 0, 1 part: KV groups
//                                                         [r G, (r+1) G), whole (column-parallel)
//   layers.{i}.attn.proj.weight     [C, H D / tp]         dim 1: the same heads' columns (row-par.)
//   layers.{i}.mlp.fc1.weight       [2 F / tp, C]         dim 0, 2 parts: gate rows
//                                                         [r F/tp, (r+1) F/tp), then the same up rows
//   layers.{i}.mlp.fc2.weight       [C, F / tp]           dim 1: the same hidden units (row-parallel)
//   output_layer.weight             [Vl, C]               dim 0, as the embedding (tied: the one slice)
//   norms                           [C]                   replicated (every rank the whole; their
//                                                         gradients equal on every rank)
// Attention runs on the rank's H / tp query heads and G KV groups; the proj and fc2 outputs are
// summed over the group (ReduceFromTpRegion), the QKV and fc1 inputs' gradients too
// (CopyToTpRegion); the output layer's input likewise. Forward returns the VOCAB-LOCAL logits
// [B, T, Vl] (columns [r Vl, (r+1) Vl) of the whole logits); Loss is the vocab-parallel cross
// entropy (no gather of the logits), the same value on every tp rank. Every rank of the tp group
// must call Forward and Loss, and run backward, together (they run its collectives). MoE models
// take tp 1 only.
//
// Layer hooks (for a data-parallel wrapper that gathers sharded params layer by layer, ddp/'s
// LayerHooks): the forward runs "forward layers" in order, 0 = embedding, 1..L = blocks, L + 1 =
// head (final norm and output projection). When hooks are set, Forward calls, for each forward
// layer i = 0, 1, ..., L + 1 in that order, on the calling thread: pre_forward(i) before any param
// of layer i is read, and post_forward(i, output) once every read of the params layer i reads has
// been issued, with the layer's output (embedding: [B, T, C]; block: [B, T, C]; head: the logits
// [B, T, V], vocab-local [B, T, V / tp] with tensor parallelism), from whose gradient all of layer i's backward follows. Each param's `layer` says
// which forward layer owns it and `also_read_by` which others read it: with tied embeddings the
// head reads embedding.weight too, so a wrapper that releases gathered params after their last
// reader keeps it until post_forward(L + 1). Hooks must not throw; they may block (e.g. on an
// all-gather).
#ifndef ORTHOSHARD_MODEL_MODEL_H_
#define ORTHOSHARD_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tp_split.h"
#include "model/document_attention.h"
#include "model/gpt_config.h"
#include "model/moe.h"
#include "model/recompute.h"
#include "model/tensor_parallel.h"

namespace orthoshard::model {

// What a param is, for optimizer routing: Muon takes kHidden; AdamW takes the rest.
enum class ParamKind { kEmbedding, kHidden, kNorm, kOutput, kRouter };
const char* ParamKindName(ParamKind kind);

// The logical blocks of a fused 2-D weight: num_groups repetitions of block_rows (rows of each
// block in order); sum(block_rows) * num_groups == rows. Same meaning as optimizers::FusedSplit.
struct FusedSplit {
  int64_t num_groups = 1;
  std::vector<int64_t> block_rows;  // empty: the whole matrix is one block
};

struct ModelParam {
  std::string name;
  at::Tensor tensor;  // the leaf (requires_grad); shape as in the file comment
  ParamKind kind;
  int layer = 0;      // owning forward layer (0 = embedding, 1..L = blocks, L + 1 = head)
  // The logical blocks of the whole matrix, also when `tensor` is a tp slice of it (Muon
  // orthogonalises the whole matrix's blocks; a slice's own follow from `tp`).
  FusedSplit split;
  std::vector<int>
      also_read_by;  // other forward layers reading it (the head, for a tied embedding)
  int expert = -1;   // MoE: the global index of the expert this param belongs to; -1: dense
  // Tensor parallelism: how the global param is split over the tp group; `tensor` holds this
  // rank's slice (common/tp_split.h). Replicated (dim -1) without tensor parallelism.
  TpSplit tp;
};

// Called around each forward layer; see the file comment for the contract. Either may be empty.
struct LayerHooks {
  std::function<void(int layer)> pre_forward;
  std::function<void(int layer, const at::Tensor& output)> post_forward;
};

// Applies rotary position embeddings to x [B, N, T, D] (D even): each pair (x[..., j],
// x[..., j + D/2]) at position t is rotated by angle t * theta^(-2j/D) (the "rotate half"
// convention of GPT-NeoX and Llama). `cos` and `sin` are either [T_max >= T, D/2] tables from
// RotaryTables (positions 0..T-1) or their rows for each token's own position, [B, 1, T, D/2].
// Differentiable in x.
at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// How Forward restricts attention to a token's own document (the same values up to rounding).
enum class DocumentAttention {
  // SDPA with is_causal over each document's segment of q, k and v, rows of equal document
  // lengths batched (model/document_attention.h): no T x T tensor; one host read of the segments
  // per forward.
  kSegments,
  // One SDPA over the whole row with a dense [B, 1, T, T] bool mask: memory grows with T^2. For
  // comparison and tests.
  kMask,
};

// The documents inside each row of a batch (DataLoader's MicroBatch::segments/positions): a token
// attends only to earlier tokens of its own document, and its rotary position counts from its
// document's start, so each document is computed as if it were alone in its row.
struct Documents {
  at::Tensor segments;   // [B, T] int64 on the params' device: document of each token, non-decreasing
  at::Tensor positions;  // [B, T] int64: position inside the document, in [0, T)
  DocumentAttention attention = DocumentAttention::kSegments;
};

enum class LossReduction { kMean, kSum };

// A target Loss does not count (cross entropy's ignore_index; the loader's kIgnoreTarget).
inline constexpr int64_t kIgnoredTarget = -100;

// cos/sin tables [max_seq_len, head_dim / 2] in `dtype` (computed in double).
void RotaryTables(int64_t max_seq_len, int64_t head_dim, double theta, at::ScalarType dtype,
                  at::Tensor* cos, at::Tensor* sin);

class Gpt {
 public:
  // Builds a model with params initialised from `seed` alone: the same seed gives bit-identical
  // params on every machine (ForEachInitialValue's values, cast to `dtype` and copied to
  // `device`). `dtype` is kFloat, kBFloat16 or kDouble. `tp`: the tensor-parallel group (see the
  // file comment; its communicator must outlive the model and its device be `device`).
  // Errors: as ValidateConfig and ValidateTensorParallel(config, tp.size()); kInvalidArgument
  // for another dtype; kInternal when LibTorch cannot place the
  // params on `device`.
  static absl::StatusOr<Gpt> Create(const GptConfig& config, uint64_t seed,
                                    at::ScalarType dtype = at::kFloat,
                                    at::Device device = at::kCPU, ExpertParallel ep = {},
                                    TensorParallel tp = {});

  // The same model with uninitialised params (allocated, never written: on the CPU, large ones
  // take no memory until touched), for a caller that moves the params into its own storage
  // first (a ZeRO-3 wrapper keeping only a shard of each) and then writes ForEachInitialValue's
  // values there, so that no process ever holds the whole initialised model. Errors: as Create.
  static absl::StatusOr<Gpt> CreateUninitialized(const GptConfig& config,
                                                 at::ScalarType dtype = at::kFloat,
                                                 at::Device device = at::kCPU,
                                                 ExpertParallel ep = {}, TensorParallel tp = {});

  // Calls fn(i, value) for every param i in order with its initial value for `seed`: an fp32 CPU
  // tensor of the param's (local) shape, drawn from one CPU generator in the listed order of the
  // whole model (normal with the param's init std; norms are ones), one param at a time; the
  // values of experts this rank does not hold are drawn and dropped, so every expert starts the
  // same at every ep; with tensor parallelism every param's whole tensor is drawn and fn gets this
  // rank's slice (TpSlice with its ModelParam::tp), so the values are the tp-1 model's.
  // Errors: the first of fn's.
  absl::Status ForEachInitialValue(
      uint64_t seed,
      const std::function<absl::Status(int index, const at::Tensor& value)>& fn) const;

  const GptConfig& config() const { return config_; }
  // All params, in the order of the file comment. The tensors are shared with the model: updating
  // them in place (under no-grad) updates the model, and `param.set_data(view)` moves a param into
  // another storage (e.g. a view of a contiguous param buffer) while autograd keeps its identity.
  const std::vector<ModelParam>& params() const { return params_; }
  int64_t num_params() const;  // total elements
  int num_forward_layers() const { return static_cast<int>(config_.num_layers) + 2; }

  // MoE: the auxiliary losses and expert loads of the last Forward or Loss, one per layer (empty
  // for a dense model). The losses are in that forward's autograd graph.
  const std::vector<MoeAux>& moe_aux() const { return moe_aux_; }
  // The experts' ep group (size 1 without one).
  const ExpertParallel& expert_parallel() const { return ep_; }
  // The tensor-parallel group (size 1 without one).
  const TensorParallel& tensor_parallel() const { return tp_; }
  // The first failed expert all-to-all or tp collective (forward or backward) since the last
  // call, which a LibTorch error thrown from backward carries only as text; OK when none failed.
  absl::Status TakeCollectiveError() const;

  // Installs (or, with empty functions, clears) the layer hooks.
  void set_layer_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }

  // QK-clip's measurement (model/qk_clip.h): with a record set, every Forward (and Loss) also
  // computes, under no-grad, each block's per-head largest attention logit (MaxAttentionLogits of
  // its q and k after rotary, causal or per document as the forward attends) and folds it into
  // record[block][head] by max, in place. `record`: fp32 [L, H] on the params' device (fill it
  // with -inf to start); an undefined tensor (the default) turns it off, at no cost. Each block
  // then costs one more q k^T product. With tensor parallelism the record still has every
  // (global) head, and a rank folds in only its own heads [r H / tp, (r + 1) H / tp); the other
  // entries are left as they are.
  void set_max_logit_record(at::Tensor record) { max_logit_record_ = std::move(record); }

  // Activation recompute (model/recompute.h), Megatron-LM's granularities: kFull keeps only each
  // selected block's input and recomputes the whole block in backward (its tp all-reduces and MoE
  // all-to-alls run again, on every rank alike); kSelective recomputes only the attention core
  // (scaled_dot_product_attention of q, k, v): it saves what the attention kernel keeps for its
  // backward, the [B, H, T, T] probabilities with ATen's math kernel, but only the output and
  // its log-sum-exp with the flash kernel ATen's CPU path takes (causal or masked, fp32 or
  // bf16), which is little. Backward also costs one more forward of what is recomputed. Loss, gradients and every recorded statistic (MoE aux, QK-clip's max logits,
  // recorded once per forward) are bitwise those without recompute (recompute_test). The model
  // must not be moved between a forward and its backward (the recompute calls it).
  enum class RecomputeGranularity { kNone, kFull, kSelective };
  struct RecomputeConfig {
    RecomputeGranularity granularity = RecomputeGranularity::kNone;
    int layers = -1;  // -1: every block; else the first `layers` blocks (Megatron's method=block)
  };
  // Errors: kInvalidArgument when layers is not -1 or in [0, num_layers].
  absl::Status set_recompute(const RecomputeConfig& recompute);
  const RecomputeConfig& recompute() const { return recompute_; }

  // logits [B, T, V] (with tensor parallelism this rank's vocabulary columns [B, T, V / tp]) for
  // tokens [B, T] (int64 on the params' device, 1 <= T <= max_seq_len, ids
  // in [0, V)); causal attention over each whole row, or within each document when `documents`
  // is given.
  // Errors: kInvalidArgument naming the expected vs received shape/dtype/id range (documents'
  // too); kInternal for a LibTorch error.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& tokens,
                                     const Documents* documents = nullptr) const;

  // Next-token cross-entropy (nats) of Forward(tokens, documents) against targets [B, T] (int64
  // ids, or kIgnoredTarget for a position that is not counted): the mean over the counted
  // targets, or their sum.
  // Errors: as Forward, and kInvalidArgument when targets' shape differs or an id is out of range.
  absl::StatusOr<at::Tensor> Loss(const at::Tensor& tokens, const at::Tensor& targets,
                                  const Documents* documents = nullptr,
                                  LossReduction reduction = LossReduction::kMean) const;

 private:
  struct Layer {
    at::Tensor attn_norm, qkv, proj, mlp_norm, fc1, fc2;
    MoeWeights moe;  // MoE models: the router and this rank's experts (fc1, fc2 undefined)
  };
  // A param of the whole model (every expert's), in the listed order, for ForEachInitialValue.
  struct InitialParam {
    std::vector<int64_t> shape;
    bool ones = false;  // norms start at 1
    double std = 0;
    int local = -1;     // its index in params_, or -1: an expert another ep rank holds
    TpSplit tp;         // this rank's slice of the value drawn in `shape`
  };

  // What every block's attention shares in one forward: the rotary rows and the documents.
  struct AttentionInputs {
    at::Tensor cos, sin;  // RotaryTables, or [B, 1, T, D/2] rows of each token's position
    // Documents::attention kMask: [B, 1, T, T] bool (true: may attend); else undefined.
    at::Tensor mask;
    // The documents of each row (kSegments), or undefined (nullopt) for causal over whole rows.
    std::optional<DocumentRuns> runs;
  };

  // CreateUninitialized's params (allocated, not written) and initial_, from config_, ep_, tp_.
  void AddParams(at::ScalarType dtype, at::Device device);
  absl::Status CheckDocuments(const at::Tensor& tokens, const Documents& documents) const;
  // The first global vocabulary id of this rank's embedding and output rows.
  int64_t VocabBegin() const { return tp_.rank() * (config_.vocab_size / tp_.size()); }
  at::Tensor ForwardUnchecked(const at::Tensor& tokens, const Documents* documents) const;
  // How one run of Block goes: where an MoE block records its aux (always non-null for MoE),
  // whether it folds its logits into the max-logit record (not when recomputed in backward), and
  // whether its attention core is recomputed in backward (kSelective).
  struct BlockRun {
    MoeAux* aux = nullptr;
    bool record = true;
    bool recompute_attention = false;
  };
  at::Tensor Block(const Layer& layer, const at::Tensor& x, const AttentionInputs& attention,
                   const BlockRun& run) const;
  // Block i (0-based) of a forward with recompute_ applied; appends its MoeAux (model_recompute.cc).
  at::Tensor RunBlock(size_t i, const at::Tensor& x, const AttentionInputs& attention) const;
  // The defined tensors of a layer in a fixed order, and a copy of `layer` holding `tensors`
  // (that order) instead (model_recompute.cc).
  static std::vector<at::Tensor> LayerTensors(const Layer& layer);
  static Layer WithTensors(const Layer& layer, const std::vector<at::Tensor>& tensors);
  // With a max-logit record: folds this forward's logits of `layer` (an element of layers_) into it.
  void RecordMaxLogits(const Layer& layer, const at::Tensor& q, const at::Tensor& k,
                       const AttentionInputs& attention) const;
  void Enter(int layer) const {
    if (hooks_.pre_forward) hooks_.pre_forward(layer);
  }
  void Leave(int layer, const at::Tensor& output) const {
    if (hooks_.post_forward) hooks_.post_forward(layer, output);
  }

  GptConfig config_;
  std::vector<ModelParam> params_;
  std::vector<InitialParam> initial_;  // the whole model's params
  ExpertParallel ep_;
  TensorParallel tp_;
  mutable std::vector<MoeAux> moe_aux_;
  std::shared_ptr<absl::Status> collective_error_ = std::make_shared<absl::Status>();
  at::Tensor embedding_, final_norm_, output_;  // output_ aliases embedding_ when tied
  std::vector<Layer> layers_;
  at::Tensor rope_cos_, rope_sin_;  // [max_seq_len, D/2]
  LayerHooks hooks_;
  at::Tensor max_logit_record_;  // [L, H] fp32, or undefined (set_max_logit_record)
  RecomputeConfig recompute_;
};

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_MODEL_H_
