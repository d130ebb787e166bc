#include "layout/presets.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/tp_split.h"

namespace orthoshard::layout {
namespace {

// The shape of a decoder: dense (experts == 0) or MoE (experts of width expert_ffn and a router).
struct Shape {
  int64_t hidden, heads, kv_groups, head_dim, ffn, vocab;
  int layers;
  bool tied;  // one shared embedding, no output layer
  int64_t experts = 0, expert_ffn = 0;
};

// Megatron's split of each kind of param (common/tp_split.h); dim -1: replicated.
constexpr int kReplicated = -1;
TpSplit SplitOf(int dim, int64_t parts, int tp) {
  TpSplit s;
  s.dim = dim;
  s.parts = parts;
  s.size = tp;
  return s;
}

// Builds params with global shapes, then makes each tp-local.
class Builder {
 public:
  explicit Builder(int tp) : tp_(tp) {}

  void Add(std::string name, std::vector<int64_t> global_shape, ParamRole role, int dim,
           int64_t parts, bool expert = false, bool shared_embedding = false) {
    ParamSpec p;
    p.name = std::move(name);
    p.dtype = DType::kBFloat16;
    p.role = role;
    p.expert = expert;
    p.shared_embedding = shared_embedding;
    p.tp = SplitOf(dim, parts, tp_);
    p.shape = TpLocalShape(std::move(global_shape), p.tp);
    params_.push_back(std::move(p));
  }
  std::vector<ParamSpec> Take() { return std::move(params_); }

 private:
  int tp_;
  std::vector<ParamSpec> params_;
};

std::string Layer(int i) { return absl::StrCat("decoder.layers.", i, "."); }

std::vector<ParamSpec> Params(const Shape& g, int tp) {
  Builder b(tp);
  const int64_t qkv_rows = (g.heads + 2 * g.kv_groups) * g.head_dim;
  b.Add("embedding.word_embeddings.weight", {g.vocab, g.hidden}, ParamRole::kAdam, 0, 1,
        /*expert=*/false, /*shared_embedding=*/g.tied);
  for (int i = 0; i < g.layers; ++i) {
    const std::string l = Layer(i);
    b.Add(l + "input_layernorm.weight", {g.hidden}, ParamRole::kAdam, kReplicated, 1);
    b.Add(l + "self_attention.linear_qkv.weight", {qkv_rows, g.hidden}, ParamRole::kMuon, 0, 1);
    b.Add(l + "self_attention.linear_proj.weight", {g.hidden, g.heads * g.head_dim},
          ParamRole::kMuon, 1, 1);
    b.Add(l + "pre_mlp_layernorm.weight", {g.hidden}, ParamRole::kAdam, kReplicated, 1);
    if (g.experts == 0) {
      b.Add(l + "mlp.linear_fc1.weight", {2 * g.ffn, g.hidden}, ParamRole::kMuon, 0, 2);
      b.Add(l + "mlp.linear_fc2.weight", {g.hidden, g.ffn}, ParamRole::kMuon, 1, 1);
      continue;
    }
    b.Add(l + "mlp.router.weight", {g.experts, g.hidden}, ParamRole::kMuon, kReplicated, 1);
    for (int64_t e = 0; e < g.experts; ++e) {
      const std::string x = absl::StrCat(l, "mlp.experts.", e, ".");
      b.Add(x + "linear_fc1.weight", {2 * g.expert_ffn, g.hidden}, ParamRole::kMuon, 0, 2,
            /*expert=*/true);
      b.Add(x + "linear_fc2.weight", {g.hidden, g.expert_ffn}, ParamRole::kMuon, 1, 1,
            /*expert=*/true);
    }
  }
  b.Add("decoder.final_layernorm.weight", {g.hidden}, ParamRole::kAdam, kReplicated, 1);
  if (!g.tied) b.Add("output_layer.weight", {g.vocab, g.hidden}, ParamRole::kAdam, 0, 1);
  return b.Take();
}

std::map<std::string, FusedBlocks> Splits(const Shape& g) {
  std::map<std::string, FusedBlocks> splits;
  for (int i = 0; i < g.layers; ++i) {
    const std::string l = Layer(i);
    splits[l + "self_attention.linear_qkv.weight"] = {
        g.kv_groups, {g.heads / g.kv_groups * g.head_dim, g.head_dim, g.head_dim}};
    if (g.experts == 0) splits[l + "mlp.linear_fc1.weight"] = {1, {g.ffn, g.ffn}};
    for (int64_t e = 0; e < g.experts; ++e) {
      splits[absl::StrCat(l, "mlp.experts.", e, ".linear_fc1.weight")] = {
          1, {g.expert_ffn, g.expert_ffn}};
    }
  }
  return splits;
}

absl::Status Divides(absl::string_view preset, int tp, int64_t value, absl::string_view what) {
  if (value % tp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("preset '", preset, "' at --tp=", tp, ": ", what, " ", value,
                   " does not split over ", tp, " tp ranks; expected tp to divide ", value));
}

// tp's constraints for `g` (Megatron's): whole KV groups per rank (so whole query heads: KV | H),
// whole SwiGLU units, whole vocabulary rows (no padded vocabulary here).
absl::Status ValidateTp(absl::string_view preset, const Shape& g, int tp) {
  if (tp < 1 || tp > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset '", preset, "': --tp is ", tp, "; expected 1 to 2^20"));
  }
  RETURN_IF_ERROR(Divides(preset, tp, g.kv_groups, "the KV groups (attention query groups)"));
  if (g.experts == 0) RETURN_IF_ERROR(Divides(preset, tp, g.ffn, "the FFN width"));
  if (g.experts > 0) RETURN_IF_ERROR(Divides(preset, tp, g.expert_ffn, "the expert FFN width"));
  return Divides(preset, tp, g.vocab, "the vocabulary");
}

// Llama-3-8B's attention: 32 heads of 128, 8 KV groups; gpt8b's: the same heads, MHA.
constexpr Shape kGpt8b = {4096, 32, 32, 128, 16384, 128256, 32, false};
constexpr Shape kLlama3 = {4096, 32, 8, 128, 14336, 128256, 32, false};
constexpr Shape kMoe60x256 = {2048, 16, 4, 128, 0, 151936, 60, true, 256, 768};
constexpr Shape kGpt2 = {768, 12, 12, 64, 2048, 50304, 12, true};
constexpr Shape kTinyLlama = {2048, 32, 4, 64, 5632, 32000, 22, false};

const Shape* Find(absl::string_view name) {
  if (name == "gpt8b") return &kGpt8b;
  if (name == "llama3_8b_gqa") return &kLlama3;
  if (name == "moe_60x256") return &kMoe60x256;
  if (name == "gpt2-124m") return &kGpt2;
  if (name == "tinyllama-1.1b") return &kTinyLlama;
  return nullptr;
}

absl::Status Unknown(absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat("preset '", name, "' is unknown; expected one of ",
                                                 absl::StrJoin(PresetNames(), ", ")));
}

}  // namespace

std::vector<ParamSpec> Gpt8bParams() { return Params(kGpt8b, 1); }
std::vector<ParamSpec> Llama3GqaParams() { return Params(kLlama3, 1); }
std::vector<ParamSpec> Moe60x256Params() { return Params(kMoe60x256, 1); }

std::vector<std::string> PresetNames() {
  return {"gpt8b", "llama3_8b_gqa", "moe_60x256", "gpt2-124m", "tinyllama-1.1b"};
}

absl::StatusOr<std::vector<ParamSpec>> PresetParams(absl::string_view name, int tp) {
  const Shape* shape = Find(name);
  if (shape == nullptr) return Unknown(name);
  RETURN_IF_ERROR(ValidateTp(name, *shape, tp));
  return Params(*shape, tp);
}

absl::StatusOr<std::map<std::string, FusedBlocks>> PresetSplits(absl::string_view name) {
  const Shape* shape = Find(name);
  if (shape == nullptr) return Unknown(name);
  return Splits(*shape);
}

}  // namespace orthoshard::layout
