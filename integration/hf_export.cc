#include "integration/hf_export.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/file_util.h"
#include "common/status_macros.h"
#include "data/dataset.h"

namespace orthoshard::integration {

using ::orthoshard::model::GptConfig;
using ::orthoshard::model::SavedModel;
using ::orthoshard::model::FormatSavedModel;
using ::orthoshard::data::PreparedInfo;
using ::orthoshard::data::ReadPreparedInfo;
namespace {

// checkpoint/'s whole-file read, its failure reported as bad input naming the file.
absl::StatusOr<std::string> ReadWhole(const std::string& path, absl::string_view what) {
  absl::StatusOr<std::string> contents = checkpoint::ReadFileToString(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' cannot be read: ",
                                                   contents.status().message()));
  }
  return contents;
}

// %.17g: every double written as JSON reads back as the same double.
std::string Number(double v) { return absl::StrFormat("%.17g", v); }

std::string ConfigJson(const SavedModel& saved, int64_t eod) {
  const GptConfig& c = saved.config;
  const std::string token_ids =
      eod >= 0 ? absl::StrCat("  \"bos_token_id\": ", eod, ",\n  \"eos_token_id\": ", eod, ",\n")
               : "  \"bos_token_id\": null,\n  \"eos_token_id\": null,\n";
  return absl::StrCat(
      "{\n"
      "  \"architectures\": [\"LlamaForCausalLM\"],\n"
      "  \"model_type\": \"llama\",\n"
      "  \"vocab_size\": ", c.vocab_size, ",\n"
      "  \"hidden_size\": ", c.hidden, ",\n"
      "  \"intermediate_size\": ", c.ffn_hidden, ",\n"
      "  \"num_hidden_layers\": ", c.num_layers, ",\n"
      "  \"num_attention_heads\": ", c.num_heads, ",\n"
      "  \"num_key_value_heads\": ", c.num_kv_heads, ",\n"
      "  \"head_dim\": ", c.hidden / c.num_heads, ",\n"
      "  \"hidden_act\": \"silu\",\n"
      "  \"max_position_embeddings\": ", c.max_seq_len, ",\n"
      "  \"rms_norm_eps\": ", Number(c.norm_eps), ",\n"
      "  \"rope_theta\": ", Number(c.rope_theta), ",\n"
      "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": ", Number(c.rope_theta),
      "},\n"
      "  \"attention_bias\": false,\n"
      "  \"mlp_bias\": false,\n"
      "  \"tie_word_embeddings\": ", c.tie_embeddings ? "true" : "false", ",\n",
      token_ids,
      "  \"initializer_range\": ", Number(c.init_std), ",\n"
      "  \"dtype\": \"", saved.precision == "bf16" ? "bfloat16" : "float32", "\",\n"
      "  \"orthoshard_model\": \"", FormatSavedModel(saved), "\"\n"
      "}\n");
}

}  // namespace

absl::StatusOr<checkpoint::ExportMapping> LlamaExportMapping(const SavedModel& saved,
                                                             const std::string& tokenizer) {
  const GptConfig& c = saved.config;
  const int64_t H = c.num_heads, KV = c.num_kv_heads, D = c.hidden / c.num_heads, R = H / KV;
  const int64_t F = c.ffn_hidden;
  checkpoint::ExportMapping mapping;
  auto add = [&](std::string name, std::string source,
                 std::vector<std::pair<int64_t, int64_t>> rows = {}) {
    mapping.tensors.push_back({std::move(name), std::move(source), std::move(rows)});
  };
  add("model.embed_tokens.weight", "embedding.weight");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string ours = absl::StrCat("layers.", i, "."), hf = absl::StrCat("model.layers.", i, ".");
    add(hf + "input_layernorm.weight", ours + "attn_norm.weight");
    std::vector<std::pair<int64_t, int64_t>> q, k, v;
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t group = g * (R + 2) * D;
      q.push_back({group, R * D});
      k.push_back({group + R * D, D});
      v.push_back({group + (R + 1) * D, D});
    }
    add(hf + "self_attn.q_proj.weight", ours + "attn.qkv.weight", q);
    add(hf + "self_attn.k_proj.weight", ours + "attn.qkv.weight", k);
    add(hf + "self_attn.v_proj.weight", ours + "attn.qkv.weight", v);
    add(hf + "self_attn.o_proj.weight", ours + "attn.proj.weight");
    add(hf + "post_attention_layernorm.weight", ours + "mlp_norm.weight");
    add(hf + "mlp.gate_proj.weight", ours + "mlp.fc1.weight", {{0, F}});
    add(hf + "mlp.up_proj.weight", ours + "mlp.fc1.weight", {{F, F}});
    add(hf + "mlp.down_proj.weight", ours + "mlp.fc2.weight");
  }
  add("model.norm.weight", "final_norm.weight");
  if (!c.tie_embeddings) add("lm_head.weight", "output_layer.weight");

  int64_t eod = -1;
  if (!tokenizer.empty()) {
    struct stat st;
    if (::stat(tokenizer.c_str(), &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer '", tokenizer, "': no such file or directory"));
    }
    if (S_ISDIR(st.st_mode)) {
      ASSIGN_OR_RETURN(const PreparedInfo info, ReadPreparedInfo(tokenizer));
      if (info.vocab_size > c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--tokenizer '", tokenizer, "': its vocabulary (", info.vocab_size,
            ") is larger than the model's (", c.vocab_size, ")"));
      }
      eod = info.eod_token;
      ASSIGN_OR_RETURN(mapping.files["tokenizer.json"], ReadWhole(info.tokenizer_path, "tokenizer"));
      ASSIGN_OR_RETURN(mapping.files["tokenizer_config.json"],
                       ReadWhole(tokenizer + "/tokenizer_config.json", "tokenizer config"));
    } else {
      ASSIGN_OR_RETURN(mapping.files["tokenizer.json"], ReadWhole(tokenizer, "tokenizer"));
      mapping.files["tokenizer_config.json"] =
          "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n"
          "  \"clean_up_tokenization_spaces\": false\n}\n";
    }
  }
  mapping.files["config.json"] = ConfigJson(saved, eod);
  return mapping;
}

}  // namespace orthoshard::integration
