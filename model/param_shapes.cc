// Param names and shapes from a GptConfig, and the saved-config check (param_shapes.h).
#include "model/param_shapes.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace orthoshard::model {
namespace {

// Larger than any real model's size field, small enough that no shape's arithmetic (at most 3 x a
// field) overflows int64.
constexpr int64_t kMaxConfigSize = int64_t{1} << 60;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Field(const char* name, int64_t value) { return absl::StrCat(name, " ", value); }

}  // namespace

std::vector<ParamShape> GptParamShapes(const GptConfig& c) {
  const int64_t C = c.hidden, H = c.num_heads, KV = c.num_kv_heads, D = C / H;
  const std::string hidden = Field("hidden", C), vocab = Field("vocab_size", c.vocab_size);
  const std::string layers = Field("num_layers", c.num_layers);
  std::vector<ParamShape> shapes;
  shapes.push_back({"embedding.weight", {c.vocab_size, C}, {vocab, hidden}, ""});
  // A SwiGLU MLP of `width` (`what` names the field): fc1 [2 width, C], fc2 [C, width].
  auto add_mlp = [&](const std::string& prefix, int64_t width, const std::string& what,
                     const std::string& exists) {
    shapes.push_back({prefix + "fc1.weight", {2 * width, C},
                      {absl::StrCat("2 * ", what), hidden}, exists});
    shapes.push_back({prefix + "fc2.weight", {C, width}, {hidden, what}, exists});
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    shapes.push_back({p + "attn_norm.weight", {C}, {hidden}, layers});
    shapes.push_back({p + "attn.qkv.weight", {(H + 2 * KV) * D, C},
                      {absl::StrCat("(num_heads + 2 * num_kv_heads) * head_dim (num_heads ", H,
                                    ", num_kv_heads ", KV, ", head_dim ", D, ")"),
                       hidden},
                      layers});
    shapes.push_back({p + "attn.proj.weight", {C, H * D},
                      {hidden, absl::StrCat("num_heads * head_dim (num_heads ", H, ", head_dim ",
                                            D, ")")},
                      layers});
    shapes.push_back({p + "mlp_norm.weight", {C}, {hidden}, layers});
    if (!c.is_moe()) {
      add_mlp(p + "mlp.", c.ffn_hidden, Field("ffn_hidden", c.ffn_hidden), layers);
      continue;
    }
    const std::string experts = Field("num_experts", c.num_experts);
    shapes.push_back({p + "mlp.router.weight", {c.num_experts, C}, {experts, hidden}, layers});
    for (int64_t e = 0; e < c.num_experts; ++e) {
      add_mlp(absl::StrCat(p, "mlp.experts.", e, "."), c.moe_ffn_hidden,
              Field("moe_ffn_hidden", c.moe_ffn_hidden), experts);
    }
    if (c.moe_shared_ffn_hidden > 0) {
      const std::string shared = Field("moe_shared_ffn_hidden", c.moe_shared_ffn_hidden);
      add_mlp(p + "mlp.shared_expert.", c.moe_shared_ffn_hidden, shared, shared);
      shapes.push_back({p + "mlp.shared_expert_gate.weight", {1, C}, {"1", hidden}, shared});
    }
  }
  shapes.push_back({"final_norm.weight", {C}, {hidden}, ""});
  if (!c.tie_embeddings) {
    shapes.push_back(
        {"output_layer.weight", {c.vocab_size, C}, {vocab, hidden}, "tie_embeddings false"});
  }
  return shapes;
}

absl::Status CheckSavedParams(const SavedModel& saved, const std::vector<SavedParam>& params) {
  const GptConfig& c = saved.config;
  RETURN_IF_ERROR(ValidateConfig(c));
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, int64_t>>{{"vocab_size", c.vocab_size},
                                                    {"max_seq_len", c.max_seq_len},
                                                    {"num_layers", c.num_layers},
                                                    {"hidden", c.hidden},
                                                    {"num_heads", c.num_heads},
                                                    {"ffn_hidden", c.ffn_hidden},
                                                    {"num_experts", c.num_experts},
                                                    {"moe_ffn_hidden", c.moe_ffn_hidden},
                                                    {"moe_shared_ffn_hidden",
                                                     c.moe_shared_ffn_hidden}}) {
    if (value > kMaxConfigSize) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", value, " is implausible (more than 2^60)"));
    }
  }
  if (saved.seq_len > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len ", saved.seq_len,
                                                   " is more than the model's max_seq_len ",
                                                   c.max_seq_len));
  }
  const std::string dtype = saved.precision == "bf16" ? "BF16" : "F32";
  std::map<std::string, const SavedParam*> by_name;
  for (const SavedParam& p : params) by_name[p.name] = &p;
  for (const ParamShape& want : GptParamShapes(c)) {
    const auto it = by_name.find(want.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(want.exists_from.empty() ? "the config" : want.exists_from,
                       " needs param '", want.name, "', which the checkpoint does not have"));
    }
    const SavedParam& have = *it->second;
    for (size_t d = 0; d < want.shape.size(); ++d) {
      if (have.shape.size() == want.shape.size() && have.shape[d] == want.shape[d]) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          want.dim_from[d], " contradicts param '", want.name, "' ", ShapeText(have.shape),
          ", which the config makes ", ShapeText(want.shape)));
    }
    if (have.dtype != dtype) {
      return absl::InvalidArgumentError(absl::StrCat("precision ", saved.precision,
                                                     " contradicts param '", want.name, "' of ",
                                                     have.dtype, ", expected ", dtype));
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    const SavedParam& extra = *by_name.begin()->second;
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", extra.name, "' ", ShapeText(extra.shape),
        " is not one of the config's (num_layers ", c.num_layers, ", num_experts ", c.num_experts,
        ", moe_shared_ffn_hidden ", c.moe_shared_ffn_hidden, ", tie_embeddings ",
        c.tie_embeddings ? "true" : "false", ")"));
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::model
