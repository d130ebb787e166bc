// orthoshard's GPT as Hugging Face transformers' LlamaForCausalLM (`ckpt export --format=hf`).
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
// plus config.json and, given a tokenizer, tokenizer.json and tokenizer_config.json, so that
// AutoModelForCausalLM.from_pretrained(dir) and AutoTokenizer.from_pretrained(dir) load it.
// LibTorch-free: the split is by rows of the saved bytes.
#ifndef ORTHOSHARD_INTEGRATION_HF_EXPORT_H_
#define ORTHOSHARD_INTEGRATION_HF_EXPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/tool/ckpt_commands.h"
#include "model/gpt_config.h"

namespace orthoshard::integration {

// The export of a model of `saved`'s shape. `tokenizer`: "" (no tokenizer files), a directory
// written by tools/prepare_data.py (its tokenizer files are copied and its EOD token becomes the
// config's bos/eos id) or a tokenizer.json file. Errors: kInvalidArgument for an unreadable or
// malformed tokenizer path or dataset.json, naming it.
absl::StatusOr<checkpoint::ExportMapping> LlamaExportMapping(const model::SavedModel& saved,
                                                             const std::string& tokenizer);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_HF_EXPORT_H_
