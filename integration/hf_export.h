// orthoshard's GPT as Hugging Face transformers' LlamaForCausalLM, and its mixture-of-experts
// models as MixtralForCausalLM (no shared expert: moe-tiny, moe-small) or Qwen2MoeForCausalLM (a
// shared expert under a sigmoid gate: moe-tiny-shared) (`ckpt export --format=hf`).
//
// The model is a Llama: RMSNorm, rotary in the rotate-half convention with theta^(-2j/D), SwiGLU,
// grouped-query attention, no biases. Only names and the fused weights differ:
//   embedding.weight               -> model.embed_tokens.weight
//   layers.i.attn_norm.weight      -> model.layers.i.input_layernorm.weight
//   layers.i.attn.qkv.weight       -> model.layers.i.self_attn.{q,k,v}_proj.weight: per KV group g
//                                     the rows of its R = H/KV query heads, its key head, its value
//                                     head (D rows each); q_proj is the groups' query rows in
//                                     order, which is query head order, and query head h uses KV
//                                     head h / R in both models
//   layers.i.attn.proj.weight      -> model.layers.i.self_attn.o_proj.weight
//   layers.i.mlp_norm.weight       -> model.layers.i.post_attention_layernorm.weight
//   layers.i.mlp.fc1.weight        -> model.layers.i.mlp.gate_proj.weight (rows [0, F)),
//                                     model.layers.i.mlp.up_proj.weight (rows [F, 2F))
//   layers.i.mlp.fc2.weight        -> model.layers.i.mlp.down_proj.weight
//   final_norm.weight              -> model.norm.weight
//   output_layer.weight            -> lm_head.weight (absent when tied: tie_word_embeddings)
// The MoE models route as both of those do (softmax over the router's logits in fp32, top-k, the
// k weights renormalised: Qwen2-MoE with norm_topk_prob), and the shared expert's output is scaled
// by sigmoid(x g^T) as Qwen2-MoE's. Their MLPs (F_e the expert width; M = model.layers.i.mlp.,
// Mixtral's B = model.layers.i.block_sparse_moe.):
//   layers.i.mlp.router.weight               -> Mixtral B gate.weight; Qwen2-MoE M gate.weight
//   layers.i.mlp.experts.e.fc1.weight        -> rows [0, F_e): B experts.e.w1.weight,
//                                               M experts.e.gate_proj.weight; rows [F_e, 2 F_e):
//                                               B experts.e.w3.weight, M experts.e.up_proj.weight
//   layers.i.mlp.experts.e.fc2.weight        -> B experts.e.w2.weight, M experts.e.down_proj.weight
//   layers.i.mlp.shared_expert.fc1, fc2      -> M shared_expert.{gate,up,down}_proj.weight
//   layers.i.mlp.shared_expert_gate.weight   -> M shared_expert_gate.weight
// (the per-expert names of Mixtral's and Qwen1.5-MoE's published checkpoints; transformers 5 merges
// them into its fused expert tensors as it loads), with qkv_bias false, every layer sparse
// (decoder_sparse_step 1, no mlp_only_layers) and no sliding window.
// Every export comes with config.json (and generation_config.json) whose bos/eos id is the checkpoint's end-of-document
// token when it records one (SavedModel::documents "eod<N>..."), and, given a tokenizer, tokenizer.json
// and tokenizer_config.json, so that AutoModelForCausalLM.from_pretrained(dir) and
// AutoTokenizer.from_pretrained(dir) load it. A tokenizer is checked before anything is written: it
// must have the structure of a Hugging Face tokenizers file, ids within the model's vocabulary and,
// where the checkpoint records one, a token at the end-of-document id.
// LibTorch-free: the split is by rows of the saved bytes.
#ifndef ORTHOSHARD_INTEGRATION_HF_EXPORT_H_
#define ORTHOSHARD_INTEGRATION_HF_EXPORT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/tool/ckpt_commands.h"
#include "model/gpt_config.h"

namespace orthoshard::integration {

// The export of a model of `saved`'s shape as the architecture the file comment names for it
// (dense: Llama; MoE: Mixtral, or Qwen2-MoE with a shared expert). `tokenizer`: "" (no tokenizer
// files), a directory written by tools/prepare_data.py (its tokenizer files are copied) or a tokenizer.json file (copied,
// with a tokenizer_config.json naming the end-of-document token as eos when the checkpoint records
// it). Errors: kInvalidArgument naming the path for an unreadable tokenizer path or dataset.json, a
// tokenizer.json that CheckTokenizerJson refuses, ids past the model's vocabulary, a prepared
// directory whose end-of-document token is not the checkpoint's, or a tokenizer without a token at
// the checkpoint's end-of-document id; those of SavedEodToken.
absl::StatusOr<checkpoint::ExportMapping> HfExportMapping(const model::SavedModel& saved,
                                                          const std::string& tokenizer);

// The end-of-document token id `saved` records (documents "eod<N>[,...]"), or -1 when it has none.
// Errors: kInvalidArgument when documents does not start with "eod" and an id below the vocabulary.
absl::StatusOr<int64_t> SavedEodToken(const model::SavedModel& saved);

// What an export needs to know of a tokenizer.json.
struct TokenizerJsonInfo {
  int64_t id_count = 0;                  // 1 + the largest id of the vocabulary and added tokens
  std::map<int64_t, std::string> tokens;  // id -> text, added tokens over the model's vocabulary
};

// Checks that `text` has the structure Hugging Face tokenizers (Tokenizer.from_file, and so
// transformers' PreTrainedTokenizerFast) reads: a JSON object with "version": "1.0"; a "model" object
// whose "type", when present, is BPE, WordPiece, WordLevel or Unigram, with a "vocab" (an object of
// token -> id, or for Unigram an array of [token, score]) and for BPE "merges" (an array of "A B" or
// ["A", "B"], A, B and the merged token all in "vocab", as tokenizers' BpeBuilder requires);
// optional "added_tokens" (an array of objects with an integer "id" and a string "content");
// optional "normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation" and "padding",
// each null or an object; no object with a key twice and at most 32 levels of nesting (checked in
// one linear pass before parsing). `path` names the file in messages. Errors: kInvalidArgument
// "--tokenizer 'PATH': not a Hugging Face tokenizer.json: <what is missing or malformed>".
absl::StatusOr<TokenizerJsonInfo> CheckTokenizerJson(absl::string_view path, const std::string& text);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_HF_EXPORT_H_
