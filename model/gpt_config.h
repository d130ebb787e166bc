// The GPT decoder's shape (GptConfig), its named presets and their validation: plain values with no
// LibTorch, so config parsing and checking (trainer_config.h) build without it. The model itself is
// in model.h.
#ifndef ORTHOSHARD_MODEL_GPT_CONFIG_H_
#define ORTHOSHARD_MODEL_GPT_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::model {

struct GptConfig {
  int64_t vocab_size = 256;     // V
  int64_t max_seq_len = 64;     // longest T accepted by Forward; rotary tables cover it
  int64_t num_layers = 2;       // L
  int64_t hidden = 64;          // C = num_heads * head_dim
  int64_t num_heads = 4;        // H (query heads)
  int64_t num_kv_heads = 4;     // KV; divides H (KV == H is plain multi-head attention)
  int64_t ffn_hidden = 192;     // F, the SwiGLU inner width
  bool tie_embeddings = true;   // output head reuses embedding.weight
  double rope_theta = 10000.0;  // rotary base
  double norm_eps = 1e-5;       // RMSNorm epsilon
  double init_std = 0.02;       // normal init std; proj and fc2 use init_std / sqrt(2 L) (GPT-2)

  // Mixture of experts: with num_experts > 0 every block's MLP is an MoE layer (model/moe.h): a
  // router [E, C] picks moe_top_k of E SwiGLU experts of width moe_ffn_hidden per token (Mixtral's
  // routing), plus, with moe_shared_ffn_hidden > 0, a shared SwiGLU expert of that width under a
  // sigmoid gate [1, C] (Qwen2-MoE's). ffn_hidden is then unused.
  int64_t num_experts = 0;            // E; 0: the dense MLP
  int64_t moe_top_k = 2;              // experts per token, 1 <= k <= E
  int64_t moe_ffn_hidden = 0;         // F_e, each expert's SwiGLU width
  int64_t moe_shared_ffn_hidden = 0;  // the shared expert's width; 0: none

  bool is_moe() const { return num_experts > 0; }
};

// Presets by name: "tiny" (2 layers, C 64, 4 heads, F 192, V 256, T 64, tied: about 19 ms per
// forward+backward of 16 x 64 tokens on one CPU thread; 300 Adam steps reach 0.46 nats on the
// synthetic corpus), "small" (4 layers, C 256, 8 heads, 2 KV heads, F 704, V 256, T 256), and
// "gpt2-124m" (12 layers, C 768, 12 heads, F 2048, V 50304, T 1024, tied: GPT-2 small's shape with
// a SwiGLU MLP of about the same parameter count), and "tinyllama-1.1b" (TinyLlama-1.1B's shape: 22
// layers, C 2048, 32 heads, 4 KV heads, F 5632, V 32000, T 2048, untied head; 1.10B params, 17.6 GB
// of fp32 params, grads and AdamW state: more than this project's 24 GB machine holds for two
// layerwise ranks, which --dist=fsdp trains). Mixture-of-experts presets: "moe-tiny" (tiny's
// attention, 4 layers, 8 experts of F_e 64, top-2: Mixtral's shape), "moe-tiny-shared" (the same
// with a shared expert of width 64 under a sigmoid gate: Qwen2-MoE's shape) and "moe-small" (small's
// attention, 8 experts of F_e 352, top-2: the active expert width 2 x 352 = small's F 704, so
// moe-small and small spend the same FLOPs per token; 4.0x small's MLP params).
// Errors: kInvalidArgument naming the known presets.
absl::StatusOr<GptConfig> GptPreset(absl::string_view name);

// Number of parameters of a model of `config` (what Gpt::num_params() returns once it is built with
// every expert): embedding V x C; per layer qkv (H + 2 KV) x D x C, proj C x C, fc1 2F x C, fc2
// C x F (MoE: a router E x C, E experts of 2 F_e x C + C x F_e, a shared expert of 2 F_s x C +
// C x F_s and its gate C) and two norms of C; the final norm C; an untied head V x C.
// Precondition: ValidateConfig(config) is OK.
int64_t GptParamCount(const GptConfig& config);

// The elements of the hidden matrices (qkv, proj, fc1, fc2 of every layer, every expert's and the
// shared expert's): what Muon updates with --optimizer=muon; the rest (embedding, norms, router,
// shared expert gate, an untied head) is AdamW's.
int64_t GptHiddenMatrixCount(const GptConfig& config);

// The elements of the experts' matrices (0 for a dense model): every expert's fc1 and fc2.
int64_t GptExpertParamCount(const GptConfig& config);

// Errors: kInvalidArgument for a non-positive size, hidden not divisible by num_heads, num_heads
// not divisible by num_kv_heads, an odd head_dim (rotary pairs), or a non-positive theta/eps/std;
// for MoE a negative expert count or shared width, moe_top_k outside [1, num_experts], or
// moe_ffn_hidden < 1.
absl::Status ValidateConfig(const GptConfig& config);

// Whether a model of `config` splits over a tensor-parallel group of `tp` ranks (Megatron-LM's
// layout, model/tensor_parallel.h): tp >= 1 divides num_heads (each rank's query heads),
// num_kv_heads (each rank holds whole KV groups), ffn_hidden (the fc1 halves' and fc2's slices)
// and vocab_size (the vocab-parallel embedding and output layer). The vocabulary is NOT padded
// to a multiple of tp: a vocabulary tp does not divide is an error, and the message lists the tp
// sizes that divide every one of these sizes. Mixture-of-experts models (num_experts > 0) take
// tp 1 only (expert tensor parallelism is not supported yet). Call it before launching ranks.
// Errors: kInvalidArgument naming the field, its size and tp; as ValidateConfig.
absl::Status ValidateTensorParallel(const GptConfig& config, int tp);

// A model's identity as a checkpoint records it (SharedState::model_config), written by the
// trainer and read back by `ckpt` to rebuild the model:
//   "model=<preset> seq_len=<S>[ vocab=<V>][ top_k=<k>][ precision=<p>][ documents=<d>]"
// vocab and top_k (MoE experts per token) only when they differ from the preset's, precision only
// when not fp32, documents only when
// the data has an EOD token or the run keeps a Megatron .idx's documents apart (so checkpoints of
// earlier versions, which had none, read the same).
struct SavedModel {
  std::string preset;
  GptConfig config;  // the preset with the saved vocabulary and top-k
  int64_t seq_len = 0;
  std::string precision = "fp32";
  // How the run treats documents: "" (no documents), "eod<id>" + ",reset" (attention within
  // documents) + ",mask_loss" (EOD loss mask), e.g. "eod0,reset", or "index,reset" (no EOD:
  // attention within the documents a Megatron .idx records). A resume must train the same way.
  std::string documents;
};
std::string FormatSavedModel(const SavedModel& saved);
// Errors: kInvalidArgument naming the text and the field that is missing or malformed, or an
// unknown preset.
absl::StatusOr<SavedModel> ParseSavedModel(absl::string_view text);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_GPT_CONFIG_H_
