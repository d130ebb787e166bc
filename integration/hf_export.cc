#include "integration/hf_export.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/file_util.h"
#include "common/json_structure.h"
#include "common/json_writer.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace orthoshard::integration {

using ::google::protobuf::ListValue;
using ::google::protobuf::Struct;
using ::google::protobuf::Value;
using ::orthoshard::data::PreparedInfo;
using ::orthoshard::data::ReadPreparedInfo;
using ::orthoshard::model::FormatSavedModel;
using ::orthoshard::model::GptConfig;
using ::orthoshard::model::SavedModel;
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

// The deepest nesting a tokenizer file may have. Hugging Face's files nest about 6 levels
// (post_processor.special_tokens.<token>.ids); protobuf's JSON mapping into google.protobuf.Value
// fails on its own past 33 nested objects (its 100-level message recursion limit, 3 levels per
// object), so at 32 every file this accepts also parses, and a deeper one is refused by the scan in
// one pass, with a message naming the limit.
constexpr int kMaxTokenizerJsonDepth = 32;

// `text` parsed as any JSON value (protobuf's JSON parser into google.protobuf.Value: objects,
// arrays, strings, numbers as doubles, booleans, null).
absl::StatusOr<Value> ParseAnyJson(const std::string& text) {
  // First a linear scan: protobuf's parser is quadratic in the nesting (json_structure.h).
  RETURN_IF_ERROR(CheckJsonStructure(text, kMaxTokenizerJsonDepth));
  Value value;
  if (const auto status = google::protobuf::util::JsonStringToMessage(text, &value); !status.ok()) {
    // Its first line only: protobuf follows it with the offending text, which may be binary.
    const std::string message(status.message());
    return absl::InvalidArgumentError(message.substr(0, message.find('\n')));
  }
  return value;
}

// The Hugging Face architecture a model exports as (hf_export.h).
enum class HfFamily { kLlama, kMixtral, kQwen2Moe };

HfFamily FamilyOf(const GptConfig& c) {
  if (!c.is_moe()) return HfFamily::kLlama;
  return c.moe_shared_ffn_hidden > 0 ? HfFamily::kQwen2Moe : HfFamily::kMixtral;
}

// pretrain's --moe_aux_loss_coeff default (integration/experts.h). The checkpoint does not record
// the run's value; transformers uses it only to train with output_router_logits.
constexpr double kRouterAuxLossCoef = 0.01;

// The MoE fields of MixtralConfig or Qwen2MoeConfig (transformers 5.24's names).
void AddMoeConfig(const GptConfig& c, HfFamily family, JsonNode* config) {
  if (family == HfFamily::kMixtral) {
    config->Add("num_local_experts", JsonNode::Int(c.num_experts))
        .Add("num_experts_per_tok", JsonNode::Int(c.moe_top_k))
        .Add("router_jitter_noise", JsonNode::Double(0.0))
        .Add("sliding_window", JsonNode());  // full causal attention
  } else {
    // Every layer sparse (decoder_sparse_step 1, no mlp_only_layers), so intermediate_size, the
    // width of Qwen2-MoE's dense MLP layers, is unused; top-k weights renormalised as Mixtral's.
    config->Add("num_experts", JsonNode::Int(c.num_experts))
        .Add("num_experts_per_tok", JsonNode::Int(c.moe_top_k))
        .Add("moe_intermediate_size", JsonNode::Int(c.moe_ffn_hidden))
        .Add("shared_expert_intermediate_size", JsonNode::Int(c.moe_shared_ffn_hidden))
        .Add("norm_topk_prob", JsonNode::Bool(true))
        .Add("decoder_sparse_step", JsonNode::Int(1))
        .Add("mlp_only_layers", JsonNode::Array({}))
        .Add("qkv_bias", JsonNode::Bool(false))
        .Add("use_sliding_window", JsonNode::Bool(false));
  }
  config->Add("output_router_logits", JsonNode::Bool(false))
      .Add("router_aux_loss_coef", JsonNode::Double(kRouterAuxLossCoef));
}

// The model's config.json: the fields of LlamaConfig, MixtralConfig or Qwen2MoeConfig, bos/eos the
// end-of-document id (null when unknown).
absl::StatusOr<std::string> ConfigJson(const SavedModel& saved, int64_t eod) {
  const GptConfig& c = saved.config;
  const HfFamily family = FamilyOf(c);
  static constexpr const char* kArchitectures[] = {"LlamaForCausalLM", "MixtralForCausalLM",
                                                   "Qwen2MoeForCausalLM"};
  static constexpr const char* kModelTypes[] = {"llama", "mixtral", "qwen2_moe"};
  const JsonNode token_id = eod >= 0 ? JsonNode::Int(eod) : JsonNode();
  JsonNode rope = JsonNode::Object();
  rope.Add("rope_type", JsonNode::String("default"))
      .Add("rope_theta", JsonNode::Double(c.rope_theta));
  JsonNode config = JsonNode::Object();
  config
      .Add("architectures",
           JsonNode::Array({JsonNode::String(kArchitectures[static_cast<int>(family)])}))
      .Add("model_type", JsonNode::String(kModelTypes[static_cast<int>(family)]))
      .Add("vocab_size", JsonNode::Int(c.vocab_size))
      .Add("hidden_size", JsonNode::Int(c.hidden))
      .Add("intermediate_size", JsonNode::Int(c.is_moe() ? c.moe_ffn_hidden : c.ffn_hidden))
      .Add("num_hidden_layers", JsonNode::Int(c.num_layers))
      .Add("num_attention_heads", JsonNode::Int(c.num_heads))
      .Add("num_key_value_heads", JsonNode::Int(c.num_kv_heads));
  // Qwen2MoeConfig has no head_dim: its attention takes hidden_size / num_attention_heads, ours.
  if (family != HfFamily::kQwen2Moe) {
    config.Add("head_dim", JsonNode::Int(c.hidden / c.num_heads));
  }
  config.Add("hidden_act", JsonNode::String("silu"))
      .Add("max_position_embeddings", JsonNode::Int(c.max_seq_len))
      .Add("rms_norm_eps", JsonNode::Double(c.norm_eps))
      .Add("rope_theta", JsonNode::Double(c.rope_theta))
      .Add("rope_parameters", std::move(rope));
  if (family == HfFamily::kLlama) {
    config.Add("attention_bias", JsonNode::Bool(false)).Add("mlp_bias", JsonNode::Bool(false));
  } else {
    AddMoeConfig(c, family, &config);
  }
  config.Add("tie_word_embeddings", JsonNode::Bool(c.tie_embeddings))
      .Add("bos_token_id", token_id)
      .Add("eos_token_id", token_id)
      .Add("initializer_range", JsonNode::Double(c.init_std))
      .Add("dtype", JsonNode::String(saved.precision == "bf16" ? "bfloat16" : "float32"))
      .Add("orthoshard_model", JsonNode::String(FormatSavedModel(saved)));
  return WriteJson(config);
}

// generation_config.json: generate() stops at the end-of-document token.
absl::StatusOr<std::string> GenerationConfigJson(int64_t eod) {
  JsonNode config = JsonNode::Object();
  config.Add("bos_token_id", JsonNode::Int(eod)).Add("eos_token_id", JsonNode::Int(eod));
  return WriteJson(config);
}

// tokenizer_config.json for a bare tokenizer.json: transformers' fast tokenizer over it, with the
// end-of-document token's text as bos and eos when known ("" otherwise).
absl::StatusOr<std::string> TokenizerConfigJson(const std::string& eod_text) {
  JsonNode config = JsonNode::Object();
  config.Add("tokenizer_class", JsonNode::String("PreTrainedTokenizerFast"))
      .Add("clean_up_tokenization_spaces", JsonNode::Bool(false));
  if (!eod_text.empty()) {
    config.Add("bos_token", JsonNode::String(eod_text)).Add("eos_token", JsonNode::String(eod_text));
  }
  return WriteJson(config);
}

using Rows = std::vector<std::pair<int64_t, int64_t>>;

void AddTensor(std::string name, std::string source, Rows rows,
               checkpoint::ExportMapping* mapping) {
  mapping->tensors.push_back({std::move(name), std::move(source), std::move(rows)});
}

// One SwiGLU MLP under `ours` (fc1 [2F, C] = [gate; up], fc2 [C, F]): the gate rows, the up rows
// and fc2 as the three named tensors.
void AddSwiGlu(const std::string& ours, int64_t F, const std::string& gate, const std::string& up,
               const std::string& down, checkpoint::ExportMapping* mapping) {
  AddTensor(gate, ours + "fc1.weight", {{0, F}}, mapping);
  AddTensor(up, ours + "fc1.weight", {{F, F}}, mapping);
  AddTensor(down, ours + "fc2.weight", {}, mapping);
}

// Layer i's MLP: Llama's mlp.{gate,up,down}_proj; Mixtral's block_sparse_moe.gate (the router) and
// experts.{e}.w1 (gate), w3 (up), w2 (down), the per-expert names its checkpoints are published
// with (transformers 5 merges them into its fused experts on load); Qwen2-MoE's mlp.gate,
// mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_expert.{gate,up,down}_proj and
// mlp.shared_expert_gate.
void AddMlp(const GptConfig& c, int64_t i, checkpoint::ExportMapping* mapping) {
  const std::string ours = absl::StrCat("layers.", i, ".mlp.");
  const std::string hf = absl::StrCat("model.layers.", i, ".");
  const HfFamily family = FamilyOf(c);
  if (family == HfFamily::kLlama) {
    AddSwiGlu(ours, c.ffn_hidden, hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight",
              hf + "mlp.down_proj.weight", mapping);
    return;
  }
  const bool mixtral = family == HfFamily::kMixtral;
  const std::string moe = hf + (mixtral ? "block_sparse_moe." : "mlp.");
  AddTensor(moe + "gate.weight", ours + "router.weight", {}, mapping);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const std::string expert = absl::StrCat(moe, "experts.", e, ".");
    AddSwiGlu(absl::StrCat(ours, "experts.", e, "."), c.moe_ffn_hidden,
              expert + (mixtral ? "w1.weight" : "gate_proj.weight"),
              expert + (mixtral ? "w3.weight" : "up_proj.weight"),
              expert + (mixtral ? "w2.weight" : "down_proj.weight"), mapping);
  }
  if (mixtral) return;
  AddSwiGlu(ours + "shared_expert.", c.moe_shared_ffn_hidden,
            moe + "shared_expert.gate_proj.weight", moe + "shared_expert.up_proj.weight",
            moe + "shared_expert.down_proj.weight", mapping);
  AddTensor(moe + "shared_expert_gate.weight", ours + "shared_expert_gate.weight", {}, mapping);
}

void AddTensors(const GptConfig& c, checkpoint::ExportMapping* mapping) {
  const int64_t H = c.num_heads, KV = c.num_kv_heads, D = c.hidden / c.num_heads, R = H / KV;
  AddTensor("model.embed_tokens.weight", "embedding.weight", {}, mapping);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string ours = absl::StrCat("layers.", i, ".");
    const std::string hf = absl::StrCat("model.layers.", i, ".");
    AddTensor(hf + "input_layernorm.weight", ours + "attn_norm.weight", {}, mapping);
    Rows q, k, v;
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t group = g * (R + 2) * D;
      q.push_back({group, R * D});
      k.push_back({group + R * D, D});
      v.push_back({group + (R + 1) * D, D});
    }
    AddTensor(hf + "self_attn.q_proj.weight", ours + "attn.qkv.weight", q, mapping);
    AddTensor(hf + "self_attn.k_proj.weight", ours + "attn.qkv.weight", k, mapping);
    AddTensor(hf + "self_attn.v_proj.weight", ours + "attn.qkv.weight", v, mapping);
    AddTensor(hf + "self_attn.o_proj.weight", ours + "attn.proj.weight", {}, mapping);
    AddTensor(hf + "post_attention_layernorm.weight", ours + "mlp_norm.weight", {}, mapping);
    AddMlp(c, i, mapping);
  }
  AddTensor("model.norm.weight", "final_norm.weight", {}, mapping);
  if (!c.tie_embeddings) AddTensor("lm_head.weight", "output_layer.weight", {}, mapping);
}

// A token id as tokenizers stores it (u32): an integral JSON number in [0, 2^32).
bool AsTokenId(const Value& v, int64_t* id) {
  if (v.kind_case() != Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0.0 && d < 4294967296.0) || std::trunc(d) != d) return false;
  *id = static_cast<int64_t>(d);
  return true;
}

const Value* Member(const Struct& object, const std::string& key) {
  const auto it = object.fields().find(key);
  return it == object.fields().end() ? nullptr : &it->second;
}

// What is wrong with a BPE model's merges ("" if nothing), as tokenizers' BpeBuilder::build checks
// them (tokenizers 0.23, models/bpe/model.rs): each merge is "A B" (one space) or ["A", "B"]; A, B
// and the merged token A + B[len(continuing_subword_prefix):] must all be in model.vocab (added
// tokens do not count), B at least as long as the prefix. A file that breaks this fails to load
// in tokenizers and AutoTokenizer (an error or a panic), so it is refused before export.
std::string MergesProblem(const Struct& model, const Struct& vocab, const Value& merges) {
  if (merges.kind_case() != Value::kListValue) return "model.merges is not an array";
  const Value* prefix_value = Member(model, "continuing_subword_prefix");
  const size_t prefix = prefix_value != nullptr && prefix_value->kind_case() == Value::kStringValue
                            ? prefix_value->string_value().size()
                            : 0;
  const ListValue& list = merges.list_value();
  for (int i = 0; i < list.values_size(); ++i) {
    const Value& merge = list.values(i);
    std::string a, b;
    if (merge.kind_case() == Value::kStringValue) {
      const std::string& line = merge.string_value();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::StrCat("model.merges[", i, "] \"", line, "\" is not \"A B\" (one space)");
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (merge.kind_case() == Value::kListValue && merge.list_value().values_size() == 2 &&
               merge.list_value().values(0).kind_case() == Value::kStringValue &&
               merge.list_value().values(1).kind_case() == Value::kStringValue) {
      a = merge.list_value().values(0).string_value();
      b = merge.list_value().values(1).string_value();
    } else {
      return absl::StrCat("model.merges[", i, "] is neither \"A B\" nor [\"A\", \"B\"]");
    }
    for (const std::string* part : {&a, &b}) {
      if (!vocab.fields().contains(*part)) {
        return absl::StrCat("model.merges[", i, "] merges '", a, "' and '", b, "', but '", *part,
                            "' is not in model.vocab");
      }
    }
    if (b.size() < prefix) {
      return absl::StrCat("model.merges[", i, "]: '", b,
                          "' is shorter than model.continuing_subword_prefix");
    }
    const std::string merged = a + b.substr(prefix);
    if (!vocab.fields().contains(merged)) {
      return absl::StrCat("model.merges[", i, "] merges '", a, "' and '", b, "' into '", merged,
                          "', which is not in model.vocab");
    }
  }
  return "";
}

// Reads the model's vocabulary into `info`; "" or what is wrong with it.
std::string ReadModelVocab(const Struct& model, TokenizerJsonInfo* info) {
  const Value* type = Member(model, "type");
  std::string kind;
  if (type != nullptr) {
    kind = type->string_value();
    if (kind != "BPE" && kind != "WordPiece" && kind != "WordLevel" && kind != "Unigram") {
      return "model.type is not one of BPE, WordPiece, WordLevel, Unigram";
    }
  }
  const Value* vocab = Member(model, "vocab");
  if (vocab == nullptr) return "no model.vocab";
  if (kind == "Unigram" || (kind.empty() && vocab->kind_case() == Value::kListValue)) {
    if (vocab->kind_case() != Value::kListValue) return "Unigram model.vocab is not an array";
    const ListValue& pieces = vocab->list_value();
    for (int i = 0; i < pieces.values_size(); ++i) {
      const Value& piece = pieces.values(i);
      if (piece.kind_case() != Value::kListValue || piece.list_value().values_size() != 2 ||
          piece.list_value().values(0).kind_case() != Value::kStringValue ||
          piece.list_value().values(1).kind_case() != Value::kNumberValue) {
        return absl::StrCat("Unigram model.vocab[", i, "] is not [token, score]");
      }
      info->tokens.emplace(i, piece.list_value().values(0).string_value());
    }
    info->id_count = pieces.values_size();
    return "";
  }
  if (vocab->kind_case() != Value::kStructValue) return "model.vocab is not an object";
  for (const auto& [token, id_value] : vocab->struct_value().fields()) {
    int64_t id;
    if (!AsTokenId(id_value, &id)) {
      return absl::StrCat("model.vocab maps '", token, "' to something not a token id");
    }
    info->tokens.emplace(id, token);
    info->id_count = std::max(info->id_count, id + 1);
  }
  const Value* merges = Member(model, "merges");
  if (kind == "BPE" && (merges == nullptr || merges->kind_case() != Value::kListValue)) {
    return "BPE model has no merges array";
  }
  // Without "type", tokenizers tries BPE first: its merges must hold as well.
  if (merges != nullptr && (kind == "BPE" || kind.empty())) {
    return MergesProblem(model, vocab->struct_value(), *merges);
  }
  return "";
}

// Reads "added_tokens" into `info` (they take precedence over the vocabulary); "" or what is wrong.
std::string ReadAddedTokens(const Struct& top, TokenizerJsonInfo* info) {
  const Value* added = Member(top, "added_tokens");
  if (added == nullptr) return "";
  if (added->kind_case() != Value::kListValue) return "added_tokens is not an array";
  for (int i = 0; i < added->list_value().values_size(); ++i) {
    const Value& token = added->list_value().values(i);
    const Value* id = token.kind_case() == Value::kStructValue ? Member(token.struct_value(), "id")
                                                               : nullptr;
    const Value* content = token.kind_case() == Value::kStructValue
                               ? Member(token.struct_value(), "content")
                               : nullptr;
    int64_t id_value;
    if (id == nullptr || !AsTokenId(*id, &id_value) || content == nullptr ||
        content->kind_case() != Value::kStringValue) {
      return absl::StrCat("added_tokens[", i, "] is not {\"id\": ID, \"content\": TEXT, ...}");
    }
    info->tokens[id_value] = content->string_value();
    info->id_count = std::max(info->id_count, id_value + 1);
  }
  return "";
}

// What is wrong with a parsed tokenizer.json ("" if nothing); fills `info`.
std::string TokenizerJsonProblem(const Value& root, TokenizerJsonInfo* info) {
  if (root.kind_case() != Value::kStructValue) return "the top level is not a JSON object";
  const Struct& top = root.struct_value();
  const Value* version = Member(top, "version");
  if (version == nullptr || version->string_value() != "1.0") {
    return "no \"version\": \"1.0\" (tokenizers' format version)";
  }
  const Value* model = Member(top, "model");
  if (model == nullptr || model->kind_case() != Value::kStructValue) return "no model object";
  for (const char* part :
       {"normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding"}) {
    const Value* v = Member(top, part);
    if (v != nullptr && v->kind_case() != Value::kNullValue && v->kind_case() != Value::kStructValue) {
      return absl::StrCat(part, " is neither null nor an object");
    }
  }
  if (std::string problem = ReadModelVocab(model->struct_value(), info); !problem.empty()) {
    return problem;
  }
  if (std::string problem = ReadAddedTokens(top, info); !problem.empty()) return problem;
  if (info->id_count == 0) return "an empty vocabulary";
  return "";
}

// The tokenizer files of `tokenizer` (a prepared directory or a tokenizer.json) into `files`, checked
// against the model; `eod` is the checkpoint's end-of-document id (-1: none), set from a prepared
// directory's when the checkpoint has none.
absl::Status AddTokenizerFiles(const SavedModel& saved, const std::string& tokenizer, int64_t* eod,
                               std::map<std::string, std::string>* files) {
  struct stat st;
  if (::stat(tokenizer.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer '", tokenizer, "': no such file or directory"));
  }
  const int64_t vocab = saved.config.vocab_size;
  std::string json_path = tokenizer;
  if (S_ISDIR(st.st_mode)) {
    absl::StatusOr<PreparedInfo> prepared = ReadPreparedInfo(tokenizer);
    if (!prepared.ok()) {  // a directory without dataset.json (kNotFound) is bad input too
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer '", tokenizer, "': not a prepared data directory: ",
          prepared.status().message()));
    }
    const PreparedInfo& info = *prepared;
    if (*eod >= 0 && info.eod_token != *eod) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer '", tokenizer, "': its end-of-document token is ", info.eod_token,
          ", the checkpoint was trained with ", *eod, " (the tokenizer of other data?)"));
    }
    *eod = info.eod_token;
    json_path = info.tokenizer_path;
    const std::string config_path = tokenizer + "/tokenizer_config.json";
    ASSIGN_OR_RETURN((*files)["tokenizer_config.json"], ReadWhole(config_path, "tokenizer config"));
    absl::StatusOr<Value> config = ParseAnyJson((*files)["tokenizer_config.json"]);
    if (!config.ok() || config->kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer '", tokenizer, "': ", config_path, " is not a JSON object"));
    }
  }
  ASSIGN_OR_RETURN(std::string text, ReadWhole(json_path, "--tokenizer"));
  ASSIGN_OR_RETURN(const TokenizerJsonInfo info, CheckTokenizerJson(json_path, text));
  if (info.id_count > vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer '", json_path, "': its token ids go up to ", info.id_count - 1,
        ", past the model's vocabulary of ", vocab));
  }
  std::string eod_text;
  if (*eod >= 0) {
    const auto it = info.tokens.find(*eod);
    if (it == info.tokens.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer '", json_path, "': has no token with id ", *eod,
          ", the checkpoint's end-of-document token (the tokenizer of other data?)"));
    }
    eod_text = it->second;
  }
  (*files)["tokenizer.json"] = std::move(text);
  if (!S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN((*files)["tokenizer_config.json"], TokenizerConfigJson(eod_text));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> SavedEodToken(const SavedModel& saved) {
  if (saved.documents.empty()) return -1;
  absl::string_view first = saved.documents;
  first = first.substr(0, first.find(','));
  int64_t eod = -1;
  if (!absl::ConsumePrefix(&first, "eod") || !absl::SimpleAtoi(first, &eod) || eod < 0 ||
      eod >= saved.config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "saved model config \"", FormatSavedModel(saved), "\": documents=", saved.documents,
        " does not start with eod<id> for an id below the vocabulary (", saved.config.vocab_size,
        ")"));
  }
  return eod;
}

absl::StatusOr<TokenizerJsonInfo> CheckTokenizerJson(absl::string_view path,
                                                     const std::string& text) {
  const std::string where = absl::StrCat("--tokenizer '", path, "': not a Hugging Face tokenizer.json: ");
  absl::StatusOr<Value> root = ParseAnyJson(text);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "not JSON (", root.status().message(), ")"));
  }
  TokenizerJsonInfo info;
  if (const std::string problem = TokenizerJsonProblem(*root, &info); !problem.empty()) {
    return absl::InvalidArgumentError(where + problem);
  }
  return info;
}

absl::StatusOr<checkpoint::ExportMapping> HfExportMapping(const SavedModel& saved,
                                                          const std::string& tokenizer) {
  checkpoint::ExportMapping mapping;
  AddTensors(saved.config, &mapping);
  ASSIGN_OR_RETURN(int64_t eod, SavedEodToken(saved));
  if (!tokenizer.empty()) RETURN_IF_ERROR(AddTokenizerFiles(saved, tokenizer, &eod, &mapping.files));
  ASSIGN_OR_RETURN(mapping.files["config.json"], ConfigJson(saved, eod));
  if (eod >= 0) {
    ASSIGN_OR_RETURN(mapping.files["generation_config.json"], GenerationConfigJson(eod));
  }
  return mapping;
}

}  // namespace orthoshard::integration
