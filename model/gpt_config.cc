// GptConfig presets and validation (gpt_config.h).
#include "model/gpt_config.h"

#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace orthoshard::model {
namespace {

absl::Status Positive(absl::string_view what, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("GptConfig: ", what, " must be > 0, got ", value));
}

}  // namespace

absl::StatusOr<GptConfig> GptPreset(absl::string_view name) {
  GptConfig c;
  if (name == "tiny") return c;
  if (name == "small") {
    c.num_layers = 4;
    c.hidden = 256;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.ffn_hidden = 704;
    c.max_seq_len = 256;
    return c;
  }
  if (name == "gpt2-124m") {
    c.vocab_size = 50304;
    c.max_seq_len = 1024;
    c.num_layers = 12;
    c.hidden = 768;
    c.num_heads = 12;
    c.num_kv_heads = 12;
    c.ffn_hidden = 2048;
    return c;
  }
  if (name == "tinyllama-1.1b") {
    c.vocab_size = 32000;
    c.max_seq_len = 2048;
    c.num_layers = 22;
    c.hidden = 2048;
    c.num_heads = 32;
    c.num_kv_heads = 4;
    c.ffn_hidden = 5632;
    c.tie_embeddings = false;
    return c;
  }
  if (name == "moe-tiny" || name == "moe-tiny-shared") {
    c.num_layers = 4;
    c.num_experts = 8;
    c.moe_top_k = 2;
    c.moe_ffn_hidden = 64;
    c.moe_shared_ffn_hidden = name == "moe-tiny-shared" ? 64 : 0;
    return c;
  }
  if (name == "moe-small") {
    c.num_layers = 4;
    c.hidden = 256;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.max_seq_len = 256;
    c.num_experts = 8;
    c.moe_top_k = 2;
    c.moe_ffn_hidden = 352;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model preset '", name,
                   "'; expected one of tiny, small, gpt2-124m, tinyllama-1.1b, moe-tiny, "
                   "moe-tiny-shared, moe-small"));
}

absl::Status ValidateTensorParallel(const GptConfig& c, int tp) {
  RETURN_IF_ERROR(ValidateConfig(c));
  if (tp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism: tp must be >= 1, got ", tp));
  }
  if (tp == 1) return absl::OkStatus();
  if (c.is_moe()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism of a mixture-of-experts model is not supported yet: num_experts ",
        c.num_experts, " needs tp 1, got tp ", tp));
  }
  const std::pair<const char*, int64_t> sizes[] = {{"num_heads", c.num_heads},
                                                   {"num_kv_heads", c.num_kv_heads},
                                                   {"ffn_hidden", c.ffn_hidden},
                                                   {"vocab_size", c.vocab_size}};
  int64_t common = 0;
  for (const auto& [name, size] : sizes) common = std::gcd(common, size);
  for (const auto& [name, size] : sizes) {
    if (size % tp == 0) continue;
    std::vector<int64_t> working;
    for (int64_t d = 1; d <= common; ++d) {
      if (common % d == 0) working.push_back(d);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism: tp ", tp, " does not divide ", name, " ", size,
        " (tp must divide num_heads ", c.num_heads, ", num_kv_heads ", c.num_kv_heads,
        ", ffn_hidden ", c.ffn_hidden, " and vocab_size ", c.vocab_size,
        "; the vocabulary is not padded); tp sizes that divide all of them: ",
        absl::StrJoin(working, ", ")));
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const GptConfig& c) {
  RETURN_IF_ERROR(Positive("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(Positive("max_seq_len", c.max_seq_len));
  RETURN_IF_ERROR(Positive("num_layers", c.num_layers));
  RETURN_IF_ERROR(Positive("hidden", c.hidden));
  RETURN_IF_ERROR(Positive("num_heads", c.num_heads));
  RETURN_IF_ERROR(Positive("num_kv_heads", c.num_kv_heads));
  RETURN_IF_ERROR(Positive("ffn_hidden", c.ffn_hidden));
  if (c.hidden % c.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig: hidden ", c.hidden,
                                                   " is not divisible by num_heads ", c.num_heads));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig: num_heads ", c.num_heads,
                                                   " is not divisible by num_kv_heads ",
                                                   c.num_kv_heads));
  }
  if ((c.hidden / c.num_heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig: head_dim ", c.hidden / c.num_heads, " must be even for rotary embeddings"));
  }
  if (!(c.rope_theta > 0) || !(c.norm_eps > 0) || !(c.init_std > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig: rope_theta, norm_eps and init_std must be > 0, got ", c.rope_theta, ", ",
        c.norm_eps, ", ", c.init_std));
  }
  if (c.num_experts < 0 || c.moe_shared_ffn_hidden < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig: num_experts and moe_shared_ffn_hidden must be >= 0, got ", c.num_experts,
        " and ", c.moe_shared_ffn_hidden));
  }
  if (c.is_moe()) {
    if (c.moe_top_k < 1 || c.moe_top_k > c.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("GptConfig: moe_top_k must be in [1, ",
                                                     c.num_experts, "] (the experts), got ",
                                                     c.moe_top_k));
    }
    RETURN_IF_ERROR(Positive("moe_ffn_hidden", c.moe_ffn_hidden));
  }
  return absl::OkStatus();
}

int64_t GptExpertParamCount(const GptConfig& c) {
  return c.num_layers * c.num_experts * 3 * c.moe_ffn_hidden * c.hidden;
}

int64_t GptHiddenMatrixCount(const GptConfig& c) {
  const int64_t C = c.hidden, F = c.ffn_hidden;
  const int64_t D = C / c.num_heads;
  const int64_t mlp = c.is_moe() ? 3 * c.moe_shared_ffn_hidden * C : 3 * F * C;
  return c.num_layers * ((c.num_heads + 2 * c.num_kv_heads) * D * C + C * c.num_heads * D + mlp) +
         GptExpertParamCount(c);
}

int64_t GptParamCount(const GptConfig& c) {
  const int64_t C = c.hidden, V = c.vocab_size;
  // MoE: the router and, with a shared expert, its gate.
  const int64_t moe_extra =
      c.is_moe() ? c.num_experts * C + (c.moe_shared_ffn_hidden > 0 ? C : 0) : 0;
  return V * C + GptHiddenMatrixCount(c) + c.num_layers * (2 * C + moe_extra) + C +
         (c.tie_embeddings ? 0 : V * C);
}

std::string FormatSavedModel(const SavedModel& saved) {
  const absl::StatusOr<GptConfig> preset = GptPreset(saved.preset);
  return absl::StrCat(
      "model=", saved.preset, " seq_len=", saved.seq_len,
      preset.ok() && preset->vocab_size == saved.config.vocab_size
          ? ""
          : absl::StrCat(" vocab=", saved.config.vocab_size),
      !preset.ok() || preset->moe_top_k == saved.config.moe_top_k
          ? ""
          : absl::StrCat(" top_k=", saved.config.moe_top_k),
      saved.precision == "fp32" ? "" : absl::StrCat(" precision=", saved.precision),
      saved.documents.empty() ? "" : absl::StrCat(" documents=", saved.documents));
}

absl::StatusOr<SavedModel> ParseSavedModel(absl::string_view text) {
  SavedModel saved;
  int64_t vocab = 0, top_k = 0;
  bool have_model = false, have_seq_len = false;
  for (absl::string_view field : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    bool ok = !kv.second.empty();
    if (kv.first == "model") {
      saved.preset = std::string(kv.second);
      have_model = ok;
    } else if (kv.first == "seq_len") {
      ok = ok && absl::SimpleAtoi(kv.second, &saved.seq_len) && saved.seq_len > 0;
      have_seq_len = ok;
    } else if (kv.first == "vocab") {
      ok = ok && absl::SimpleAtoi(kv.second, &vocab) && vocab > 0;
    } else if (kv.first == "top_k") {
      ok = ok && absl::SimpleAtoi(kv.second, &top_k) && top_k > 0;
    } else if (kv.first == "documents") {
      saved.documents = std::string(kv.second);
      ok = ok && (absl::StartsWith(saved.documents, "eod") || saved.documents == "index,reset");
    } else if (kv.first == "precision") {
      saved.precision = std::string(kv.second);
      ok = ok && (saved.precision == "fp32" || saved.precision == "bf16");
    } else {
      ok = false;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("saved model config \"", text,
                                                     "\": unknown or malformed field \"", field,
                                                     "\""));
    }
  }
  if (!have_model || !have_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "saved model config \"", text, "\": expected model=<preset> and seq_len=<tokens>"));
  }
  ASSIGN_OR_RETURN(saved.config, GptPreset(saved.preset));
  if (vocab > 0) saved.config.vocab_size = vocab;
  if (top_k > 0) saved.config.moe_top_k = top_k;
  RETURN_IF_ERROR(ValidateConfig(saved.config));
  return saved;
}

}  // namespace orthoshard::model
