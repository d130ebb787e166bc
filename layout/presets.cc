#include "layout/presets.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoshard::layout {
namespace {

ParamSpec Param(std::string name, std::vector<int64_t> shape, ParamRole role,
                bool expert = false, bool shared_embedding = false) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.dtype = DType::kBFloat16;
  p.role = role;
  p.expert = expert;
  p.shared_embedding = shared_embedding;
  return p;
}

struct DenseGpt {
  int64_t hidden, qkv_rows, ffn, vocab;
  int layers;
};

std::vector<ParamSpec> DenseParams(const DenseGpt& g) {
  std::vector<ParamSpec> params;
  params.push_back(Param("embedding.word_embeddings.weight", {g.vocab, g.hidden}, ParamRole::kAdam));
  for (int i = 0; i < g.layers; ++i) {
    const std::string l = absl::StrCat("decoder.layers.", i, ".");
    params.push_back(Param(l + "input_layernorm.weight", {g.hidden}, ParamRole::kAdam));
    params.push_back(
        Param(l + "self_attention.linear_qkv.weight", {g.qkv_rows, g.hidden}, ParamRole::kMuon));
    params.push_back(
        Param(l + "self_attention.linear_proj.weight", {g.hidden, g.hidden}, ParamRole::kMuon));
    params.push_back(Param(l + "pre_mlp_layernorm.weight", {g.hidden}, ParamRole::kAdam));
    params.push_back(Param(l + "mlp.linear_fc1.weight", {2 * g.ffn, g.hidden}, ParamRole::kMuon));
    params.push_back(Param(l + "mlp.linear_fc2.weight", {g.hidden, g.ffn}, ParamRole::kMuon));
  }
  params.push_back(Param("decoder.final_layernorm.weight", {g.hidden}, ParamRole::kAdam));
  params.push_back(Param("output_layer.weight", {g.vocab, g.hidden}, ParamRole::kAdam));
  return params;
}

}  // namespace

std::vector<ParamSpec> Gpt8bParams() {
  return DenseParams({/*hidden=*/4096, /*qkv_rows=*/3 * 4096, /*ffn=*/16384, /*vocab=*/128256,
                      /*layers=*/32});
}

std::vector<ParamSpec> Llama3GqaParams() {
  // 32 query heads + 2 x 8 KV groups, head dim 128.
  return DenseParams({/*hidden=*/4096, /*qkv_rows=*/(32 + 2 * 8) * 128, /*ffn=*/14336,
                      /*vocab=*/128256, /*layers=*/32});
}

std::vector<ParamSpec> Moe60x256Params() {
  constexpr int64_t kHidden = 2048, kQkvRows = (16 + 2 * 4) * 128, kExpertFfn = 768,
                    kExperts = 256, kVocab = 151936;
  std::vector<ParamSpec> params;
  params.push_back(Param("embedding.word_embeddings.weight", {kVocab, kHidden}, ParamRole::kAdam,
                         /*expert=*/false, /*shared_embedding=*/true));
  for (int i = 0; i < 60; ++i) {
    const std::string l = absl::StrCat("decoder.layers.", i, ".");
    params.push_back(Param(l + "input_layernorm.weight", {kHidden}, ParamRole::kAdam));
    params.push_back(
        Param(l + "self_attention.linear_qkv.weight", {kQkvRows, kHidden}, ParamRole::kMuon));
    params.push_back(
        Param(l + "self_attention.linear_proj.weight", {kHidden, kHidden}, ParamRole::kMuon));
    params.push_back(Param(l + "pre_mlp_layernorm.weight", {kHidden}, ParamRole::kAdam));
    params.push_back(Param(l + "mlp.router.weight", {kExperts, kHidden}, ParamRole::kMuon));
    for (int e = 0; e < kExperts; ++e) {
      const std::string x = absl::StrCat(l, "mlp.experts.", e, ".");
      params.push_back(Param(x + "linear_fc1.weight", {2 * kExpertFfn, kHidden}, ParamRole::kMuon,
                             /*expert=*/true));
      params.push_back(Param(x + "linear_fc2.weight", {kHidden, kExpertFfn}, ParamRole::kMuon,
                             /*expert=*/true));
    }
  }
  params.push_back(Param("decoder.final_layernorm.weight", {kHidden}, ParamRole::kAdam));
  return params;
}

std::vector<std::string> PresetNames() { return {"gpt8b", "llama3_8b_gqa", "moe_60x256"}; }

absl::StatusOr<std::vector<ParamSpec>> PresetParams(absl::string_view name) {
  if (name == "gpt8b") return Gpt8bParams();
  if (name == "llama3_8b_gqa") return Llama3GqaParams();
  if (name == "moe_60x256") return Moe60x256Params();
  return absl::InvalidArgumentError(absl::StrCat("preset '", name, "' is unknown; expected one of ",
                                                 absl::StrJoin(PresetNames(), ", ")));
}

}  // namespace orthoshard::layout
