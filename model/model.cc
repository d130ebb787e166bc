#include "model/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/qk_clip.h"
#include "model/swiglu.h"

namespace orthoshard::model {
namespace {

std::string ShapeString(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// Checks ids [B, T] are int64 and in [0, vocab) (or kIgnoredTarget when allowed).
absl::Status CheckIds(absl::string_view what, const at::Tensor& ids, int64_t vocab,
                      int64_t max_seq_len, bool allow_ignored = false) {
  if (!ids.defined() || ids.dim() != 2 || ids.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gpt: ", what, " must be an int64 tensor [batch, seq], got ",
        ids.defined() ? absl::StrCat(c10::toString(ids.scalar_type()), " ", ShapeString(ids))
                      : std::string("an undefined tensor")));
  }
  if (ids.size(0) < 1 || ids.size(1) < 1 || ids.size(1) > max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("Gpt: ", what, " shape ", ShapeString(ids),
                                                   " needs batch >= 1 and 1 <= seq <= ",
                                                   max_seq_len));
  }
  const int64_t lo =
      allow_ignored ? ids.masked_fill(ids.eq(kIgnoredTarget), 0).min().item<int64_t>()
                    : ids.min().item<int64_t>();
  const int64_t hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat("Gpt: ", what, " ids must be in [0, ", vocab,
                                                   "), got range [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ParamKindName(ParamKind kind) {
  switch (kind) {
    case ParamKind::kEmbedding: return "embedding";
    case ParamKind::kHidden: return "hidden";
    case ParamKind::kNorm: return "norm";
    case ParamKind::kOutput: return "output";
    case ParamKind::kRouter: return "router";
  }
  return "?";
}

void RotaryTables(int64_t max_seq_len, int64_t head_dim, double theta, at::ScalarType dtype,
                  at::Tensor* cos, at::Tensor* sin) {
  const int64_t half = head_dim / 2;
  std::vector<double> c(max_seq_len * half), s(max_seq_len * half);
  for (int64_t t = 0; t < max_seq_len; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      // RoFormer (Su et al. 2021), eq. 15: theta_j = base^(-2j/d).
      const double angle = static_cast<double>(t) *
                           std::pow(theta, -2.0 * static_cast<double>(j) / head_dim);
      c[t * half + j] = std::cos(angle);
      s[t * half + j] = std::sin(angle);
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  *cos = at::from_blob(c.data(), {max_seq_len, half}, opts).clone().to(dtype);  // own the data
  *sin = at::from_blob(s.data(), {max_seq_len, half}, opts).clone().to(dtype);
}

at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t t = x.size(-2);
  const int64_t half = x.size(-1) / 2;
  // Tables: [T, D/2], broadcast over [B, N]; per-token rows: [B, 1, T, D/2], broadcast over N.
  const at::Tensor c = cos.dim() == 2 ? cos.narrow(0, 0, t) : cos;
  const at::Tensor s = sin.dim() == 2 ? sin.narrow(0, 0, t) : sin;
  // split, not two narrows: its backward concatenates the halves' grads, where a narrow's
  // backward zero-fills a tensor of x's size for each half and adds them (see Block).
  const std::vector<at::Tensor> halves = x.split(half, -1);
  const at::Tensor& x1 = halves[0];
  const at::Tensor& x2 = halves[1];
  const at::Tensor parts[] = {x1 * c - x2 * s, x1 * s + x2 * c};
  return at::cat(at::TensorList(parts), -1);
}

namespace {

// How a param splits over the tp group along `dim` in `parts` (tensor_parallel.h); replicated
// (TpSplit's default) at tp 1.
TpSplit SplitOver(const TensorParallel& tp, int dim, int64_t parts) {
  TpSplit s;
  if (tp.size() == 1) return s;
  s.size = tp.size();
  s.rank = tp.rank();
  s.dim = dim;
  s.parts = parts;
  return s;
}

}  // namespace

// The params of config_ as this rank holds them (ep_'s experts, tp_'s slices), uninitialised, and
// initial_, the whole model's list for ForEachInitialValue.
void Gpt::AddParams(at::ScalarType dtype, at::Device device) {
  const GptConfig& config = config_;
  const ExpertParallel& ep = ep_;
  const TensorParallel& tp = tp_;
  const int64_t C = config.hidden, V = config.vocab_size, F = config.ffn_hidden;
  const int64_t H = config.num_heads, KV = config.num_kv_heads, D = C / H;
  const int L = static_cast<int>(config.num_layers);
  const double residual_std = config.init_std / std::sqrt(2.0 * L);
  const int64_t local_experts = config.is_moe() ? config.num_experts / ep.size() : 0;
  const int64_t first_expert = ep.rank() * local_experts;

  auto tp_split = [&tp](int dim, int64_t parts) { return SplitOver(tp, dim, parts); };
  const TpSplit replicated = tp_split(-1, 1), rows = tp_split(0, 1), columns = tp_split(1, 1);
  // Uninitialised memory: nothing is written (or, for large params, even committed) until the
  // values arrive. An expert of another ep rank is only listed for the initial values.
  // `shape` is the global shape; the tensor has this rank's slice of it.
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamKind kind, int layer,
                 double std, TpSplit split_tp, FusedSplit split = {}, int expert = -1) {
    InitialParam initial{shape, kind == ParamKind::kNorm, std, -1, split_tp};
    at::Tensor t;
    if (expert < 0 || (expert >= first_expert && expert < first_expert + local_experts)) {
      initial.local = static_cast<int>(params_.size());
      t = at::empty(TpLocalShape(shape, split_tp),
                    at::TensorOptions().dtype(dtype).device(device));
      t.set_requires_grad(true);
      params_.push_back(
          {std::move(name), t, kind, layer, std::move(split), {}, expert, split_tp});
    }
    initial_.push_back(std::move(initial));
    return t;
  };
  auto add_mlp = [&](const std::string& p, int64_t width, int layer, int expert,
                     at::Tensor* fc1, at::Tensor* fc2) {
    // MoE models are tp 1 (ValidateTensorParallel): the splits are then replicated.
    at::Tensor a = add(p + "fc1.weight", {2 * width, C}, ParamKind::kHidden, layer,
                       config.init_std, tp_split(0, 2), FusedSplit{1, {width, width}}, expert);
    at::Tensor b = add(p + "fc2.weight", {C, width}, ParamKind::kHidden, layer, residual_std,
                       columns, {}, expert);
    if (a.defined()) *fc1 = a, *fc2 = b;
  };

  embedding_ =
      add("embedding.weight", {V, C}, ParamKind::kEmbedding, 0, config.init_std, rows);
  for (int i = 0; i < L; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    Layer layer;
    layer.attn_norm = add(p + "attn_norm.weight", {C}, ParamKind::kNorm, i + 1, 0, replicated);
    layer.qkv = add(p + "attn.qkv.weight", {(H + 2 * KV) * D, C}, ParamKind::kHidden, i + 1,
                    config.init_std, rows, FusedSplit{KV, {H / KV * D, D, D}});
    layer.proj = add(p + "attn.proj.weight", {C, H * D}, ParamKind::kHidden, i + 1, residual_std,
                     columns);
    layer.mlp_norm = add(p + "mlp_norm.weight", {C}, ParamKind::kNorm, i + 1, 0, replicated);
    if (!config.is_moe()) {
      add_mlp(p + "mlp.", F, i + 1, -1, &layer.fc1, &layer.fc2);
    } else {
      MoeWeights& moe = layer.moe;
      moe.router = add(p + "mlp.router.weight", {config.num_experts, C}, ParamKind::kRouter,
                       i + 1, config.init_std, replicated);
      moe.fc1.resize(local_experts);
      moe.fc2.resize(local_experts);
      for (int e = 0; e < config.num_experts; ++e) {
        const int64_t j = e - first_expert;
        at::Tensor fc1, fc2;
        add_mlp(absl::StrCat(p, "mlp.experts.", e, "."), config.moe_ffn_hidden, i + 1, e, &fc1,
                &fc2);
        if (fc1.defined()) moe.fc1[j] = fc1, moe.fc2[j] = fc2;
      }
      if (config.moe_shared_ffn_hidden > 0) {
        add_mlp(p + "mlp.shared_expert.", config.moe_shared_ffn_hidden, i + 1, -1,
                &moe.shared_fc1, &moe.shared_fc2);
        moe.shared_gate = add(p + "mlp.shared_expert_gate.weight", {1, C}, ParamKind::kRouter,
                              i + 1, config.init_std, replicated);
      }
    }
    layers_.push_back(std::move(layer));
  }
  final_norm_ = add("final_norm.weight", {C}, ParamKind::kNorm, L + 1, 0, replicated);
  if (config.tie_embeddings) {
    output_ = embedding_;
    params_.front().also_read_by = {L + 1};
  } else {
    output_ =
        add("output_layer.weight", {V, C}, ParamKind::kOutput, L + 1, config.init_std, rows);
  }
}

absl::StatusOr<Gpt> Gpt::CreateUninitialized(const GptConfig& config, at::ScalarType dtype,
                                             at::Device device, ExpertParallel ep,
                                             TensorParallel tp) {
  RETURN_IF_ERROR(ValidateConfig(config));
  RETURN_IF_ERROR(ValidateTensorParallel(config, tp.size()));
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kDouble) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gpt: param dtype must be float, bfloat16 or double, got ", c10::toString(dtype)));
  }
  if (config.is_moe() && config.num_experts % ep.size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gpt: ", config.num_experts, " experts do not split evenly over an ep group of ",
                     ep.size(), " ranks"));
  }
  try {
    Gpt model;
    model.config_ = config;
    model.ep_ = ep;
    model.tp_ = tp;
    model.AddParams(dtype, device);
    const int64_t D = config.hidden / config.num_heads;
    RotaryTables(config.max_seq_len, D, config.rope_theta, dtype, &model.rope_cos_,
                 &model.rope_sin_);
    model.rope_cos_ = model.rope_cos_.to(device);
    model.rope_sin_ = model.rope_sin_.to(device);
    return model;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("Gpt: LibTorch error: ", e.what_without_backtrace()));
  }
}

absl::Status Gpt::ForEachInitialValue(
    uint64_t seed,
    const std::function<absl::Status(int index, const at::Tensor& value)>& fn) const {
  try {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (const InitialParam& p : initial_) {
      at::Tensor value;
      if (p.ones) {
        value = at::ones(p.shape, at::kFloat);
      } else {
        value = at::empty(p.shape, at::kFloat);
        value.normal_(0.0, p.std, gen);
      }
      if (p.local >= 0) RETURN_IF_ERROR(fn(p.local, p.tp.split() ? TpSlice(value, p.tp) : value));
    }
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("Gpt: LibTorch error: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<Gpt> Gpt::Create(const GptConfig& config, uint64_t seed, at::ScalarType dtype,
                                at::Device device, ExpertParallel ep, TensorParallel tp) {
  ASSIGN_OR_RETURN(Gpt model, CreateUninitialized(config, dtype, device, ep, tp));
  const std::vector<ModelParam>& params = model.params();
  RETURN_IF_ERROR(model.ForEachInitialValue(seed, [&](int i, const at::Tensor& value) {
    at::NoGradGuard no_grad;
    params[i].tensor.copy_(value);
    return absl::OkStatus();
  }));
  return model;
}

absl::Status Gpt::TakeCollectiveError() const {
  absl::Status error = std::move(*collective_error_);
  *collective_error_ = absl::OkStatus();
  return error;
}

int64_t Gpt::num_params() const {
  int64_t n = 0;
  for (const ModelParam& p : params_) n += p.tensor.numel();
  return n;
}

at::Tensor Gpt::Block(const Layer& layer, const at::Tensor& x, const AttentionInputs& attention,
                      const BlockRun& run) const {
  const int64_t B = x.size(0), T = x.size(1), C = config_.hidden, D = C / config_.num_heads;
  // This rank's query heads and KV groups (all of them at tp 1).
  const int64_t H = config_.num_heads / tp_.size(), KV = config_.num_kv_heads / tp_.size();
  const int64_t R = H / KV;
  absl::Status* error = collective_error_.get();

  // Column-parallel QKV: the replicated normed input in, this rank's KV groups out.
  const at::Tensor h = CopyToTpRegion(at::rms_norm(x, {C}, layer.attn_norm, config_.norm_eps), tp_,
                                      error);
  // The fused outputs are taken apart by split, whose backward concatenates the parts' grads into
  // the fused grad. narrow/select would give the same values, but each one's backward allocates
  // and zero-fills a tensor of the whole fused output and the parts are then added: on a CPU that
  // was 10% of backward (pretrain --profile_step_start, `small`), mostly page faults of the fresh
  // zero tensors.
  const at::Tensor qkv = at::linear(h, layer.qkv).view({B, T, KV, R + 2, D});
  const std::vector<at::Tensor> qkv_parts = qkv.split_with_sizes({R, 1, 1}, 3);
  at::Tensor q = qkv_parts[0].reshape({B, T, H, D}).transpose(1, 2);  // [B, H, T, D]
  at::Tensor k = qkv_parts[1].squeeze(3).transpose(1, 2);             // [B, KV, T, D]
  const at::Tensor v = qkv_parts[2].squeeze(3).transpose(1, 2);       // [B, KV, T, D]
  q = ApplyRotary(q, attention.cos, attention.sin);
  k = ApplyRotary(k, attention.cos, attention.sin);
  if (max_logit_record_.defined() && run.record) RecordMaxLogits(layer, q, k, attention);
  // Documents: SDPA per document segment (DocumentSdpa), or a dense mask in place of the causal
  // flag (it is causal itself; ATen's CPU flash kernel takes either at about the same speed).
  // Grouped-query attention by the kernel (enable_gqa: query head h reads KV head h / R, as
  // repeating each KV head R times would give) rather than materialising the repeated K and V:
  // that was a copy of each in forward and a sum over the R copies of their gradients in backward.
  // The core is a RecomputeFn (inputs q, k, v), run directly or, selective, under Recompute.
  const bool masked = attention.mask.defined();
  const RecomputeFn core = [runs = attention.runs, mask = attention.mask, masked, R](
                              const std::vector<at::Tensor>& in, const std::vector<at::Tensor>&,
                              bool) -> std::vector<at::Tensor> {
    if (runs.has_value()) return {DocumentSdpa(*runs, in[0], in[1], in[2])};
    return {at::scaled_dot_product_attention(
        in[0], in[1], in[2], masked ? std::optional<at::Tensor>(mask) : std::nullopt,
        /*dropout_p=*/0.0, /*is_causal=*/!masked, /*scale=*/std::nullopt, /*enable_gqa=*/R > 1)};
  };
  const at::Tensor y =
      (run.recompute_attention ? Recompute(core, {q, k, v}, {}) : core({q, k, v}, {}, false))[0];
  // Row-parallel proj: this rank's heads' columns, summed over the group.
  const at::Tensor x1 =
      x + ReduceFromTpRegion(at::linear(y.transpose(1, 2).reshape({B, T, H * D}), layer.proj), tp_,
                             error);

  const at::Tensor m = at::rms_norm(x1, {C}, layer.mlp_norm, config_.norm_eps);
  if (config_.is_moe()) {
    return x1 + MoeMlp(config_, layer.moe, ep_, m, run.aux, collective_error_.get());
  }
  // Column-parallel fc1 (this rank's hidden units of gate and up), row-parallel fc2.
  const at::Tensor a = SwiGluIn(CopyToTpRegion(m, tp_, error), layer.fc1);  // [B, T, F / tp]
  return x1 + ReduceFromTpRegion(at::linear(a, layer.fc2), tp_, error);
}

void Gpt::RecordMaxLogits(const Layer& layer, const at::Tensor& q, const at::Tensor& k,
                          const AttentionInputs& attention) const {
  const int64_t block = &layer - layers_.data();
  // This rank's heads of the block's row (q has them in order).
  const int64_t heads = q.size(1);
  at::Tensor row = max_logit_record_.select(0, block).narrow(0, tp_.rank() * heads, heads);
  const at::Tensor logits = attention.runs.has_value()
                               ? DocumentMaxAttentionLogits(*attention.runs, q, k)
                               : MaxAttentionLogits(q, k, attention.mask);
  row.copy_(at::maximum(row, logits));
}

at::Tensor Gpt::ForwardUnchecked(const at::Tensor& tokens, const Documents* documents) const {
  AttentionInputs attention{rope_cos_, rope_sin_, at::Tensor(), std::nullopt};
  if (documents != nullptr) {
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t half = rope_cos_.size(1);
    const at::Tensor flat = documents->positions.reshape({-1});
    attention.cos = rope_cos_.index_select(0, flat).view({B, 1, T, half});
    attention.sin = rope_sin_.index_select(0, flat).view({B, 1, T, half});
    if (documents->attention == DocumentAttention::kMask) {
      attention.mask = DocumentMask(documents->segments);
    } else {
      attention.runs = PlanDocumentRuns(documents->segments);  // the one host read
    }
  }
  moe_aux_.clear();
  Enter(0);
  at::Tensor x = VocabParallelEmbedding(embedding_, tokens, VocabBegin(), tp_,
                                        collective_error_.get());  // [B, T, C]
  Leave(0, x);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int layer = static_cast<int>(i) + 1;
    Enter(layer);
    x = RunBlock(i, x, attention);
    Leave(layer, x);
  }
  const int head = static_cast<int>(layers_.size()) + 1;
  Enter(head);
  x = CopyToTpRegion(at::rms_norm(x, {config_.hidden}, final_norm_, config_.norm_eps), tp_,
                     collective_error_.get());
  const at::Tensor logits = at::linear(x, output_);  // [B, T, V / tp]
  Leave(head, logits);
  return logits;
}

absl::Status Gpt::CheckDocuments(const at::Tensor& tokens, const Documents& documents) const {
  for (const auto& [what, t] : {std::pair<const char*, const at::Tensor*>{"segments", &documents.segments},
                                {"positions", &documents.positions}}) {
    if (!t->defined() || t->scalar_type() != at::kLong || !t->sizes().equals(tokens.sizes()) ||
        t->device() != tokens.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Gpt: documents' ", what, " must be an int64 tensor of the tokens' shape ",
          ShapeString(tokens), " on their device, got ",
          t->defined() ? absl::StrCat(c10::toString(t->scalar_type()), " ", ShapeString(*t))
                       : std::string("an undefined tensor")));
    }
  }
  const int64_t T = tokens.size(1);
  const int64_t lo = documents.positions.min().item<int64_t>();
  const int64_t hi = documents.positions.max().item<int64_t>();
  if (lo < 0 || hi >= T) {
    return absl::InvalidArgumentError(absl::StrCat("Gpt: documents' positions must be in [0, ", T,
                                                   "), got range [", lo, ", ", hi, "]"));
  }
  // A document is a run of equal ids (the segments path cuts rows there): ids never decrease.
  const at::Tensor& seg = documents.segments;
  if (T > 1 && seg.narrow(1, 1, T - 1).lt(seg.narrow(1, 0, T - 1)).any().item<bool>()) {
    return absl::InvalidArgumentError(
        "Gpt: documents' segments must be non-decreasing along each row");
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Gpt::Forward(const at::Tensor& tokens, const Documents* documents) const {
  try {
    RETURN_IF_ERROR(CheckIds("tokens", tokens, config_.vocab_size, config_.max_seq_len));
    if (documents != nullptr) RETURN_IF_ERROR(CheckDocuments(tokens, *documents));
    return ForwardUnchecked(tokens, documents);
  } catch (const c10::Error& e) {
    RETURN_IF_ERROR(TakeCollectiveError());
    return absl::InternalError(absl::StrCat("Gpt: LibTorch error: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> Gpt::Loss(const at::Tensor& tokens, const at::Tensor& targets,
                                     const Documents* documents, LossReduction reduction) const {
  try {
    RETURN_IF_ERROR(CheckIds("tokens", tokens, config_.vocab_size, config_.max_seq_len));
    RETURN_IF_ERROR(CheckIds("targets", targets, config_.vocab_size, config_.max_seq_len,
                             /*allow_ignored=*/true));
    if (!targets.sizes().equals(tokens.sizes())) {
      return absl::InvalidArgumentError(absl::StrCat("Gpt: targets shape ", ShapeString(targets),
                                                     " differs from tokens shape ",
                                                     ShapeString(tokens)));
    }
    if (documents != nullptr) RETURN_IF_ERROR(CheckDocuments(tokens, *documents));
    at::Tensor logits = ForwardUnchecked(tokens, documents);
    // Mixed precision: log-softmax and the mean over tokens in fp32 (the cast's backward rounds
    // the logits' gradient back to bf16).
    if (logits.scalar_type() == at::kBFloat16) logits = logits.to(at::kFloat);
    if (tp_.size() > 1) {
      // The mean as cross_entropy_loss takes it: the sum over counted targets over their count
      // (0 / 0 = NaN when none is counted).
      const at::Tensor flat_targets = targets.reshape({-1});
      const at::Tensor per_token = VocabParallelCrossEntropy(
          logits.reshape({-1, logits.size(-1)}), flat_targets, VocabBegin(), kIgnoredTarget, tp_,
          collective_error_.get());
      const at::Tensor sum = per_token.sum();
      if (reduction == LossReduction::kSum) return sum;
      return sum / flat_targets.ne(kIgnoredTarget).sum().to(sum.scalar_type());
    }
    return at::cross_entropy_loss(
        logits.reshape({-1, config_.vocab_size}), targets.reshape({-1}), /*weight=*/{},
        reduction == LossReduction::kSum ? at::Reduction::Sum : at::Reduction::Mean,
        /*ignore_index=*/kIgnoredTarget);
  } catch (const c10::Error& e) {
    RETURN_IF_ERROR(TakeCollectiveError());
    return absl::InternalError(absl::StrCat("Gpt: LibTorch error: ", e.what_without_backtrace()));
  }
}

}  // namespace orthoshard::model
