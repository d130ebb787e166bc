// Named model parameter lists for planning without a spec file: the reference GPT of issue 3,
// the trainer's gpt2-124m and tinyllama-1.1b, and models that exercise GQA shapes and MoE experts.
// Params come in forward (model-definition) order with Megatron's names and routing (2-D hidden
// matrices → Muon, everything else → Adam). Every preset can be planned at a tensor-parallel size:
// shapes are then tp-local and ParamSpec::tp says how each is split (Megatron's layout,
// common/tp_split.h): QKV column-parallel by KV groups, fc1 column-parallel in its gate and up
// halves, proj and fc2 row-parallel, embedding and output layer vocab-parallel, norms and the MoE
// router replicated; each expert's fc1/fc2 split as the dense MLP's (expert tensor parallelism
// equal to tp).
#ifndef ORTHOSHARD_LAYOUT_PRESETS_H_
#define ORTHOSHARD_LAYOUT_PRESETS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/fused_blocks.h"
#include "layout/layout.h"

namespace orthoshard::layout {

// "gpt8b": hidden 4096, MHA qkv 12288x4096, proj 4096x4096, SwiGLU fc1 32768x4096, fc2
// 4096x16384, 32 layers, untied embedding and output 128256x4096, two norms per layer and a final
// norm; all bf16.
std::vector<ParamSpec> Gpt8bParams();

// "llama3_8b_gqa" (Llama-3-8B's shape): like gpt8b with grouped-query attention (32 heads, 8 KV
// groups: qkv 6144x4096) and fc1 28672x4096 / fc2 4096x14336.
std::vector<ParamSpec> Llama3GqaParams();

// "moe_60x256": 60 layers, hidden 2048, GQA attention (16 heads, 4 KV groups: qkv 3072x2048, proj
// 2048x2048), a router 256x2048 (routed to Muon) and 256 experts per layer as separate params (fc1
// 1536x2048, fc2 2048x768, expert), tied (shared) embedding 151936x2048. 31,022 params.
std::vector<ParamSpec> Moe60x256Params();

// Names accepted by PresetParams, in a stable order: gpt8b, llama3_8b_gqa, moe_60x256, gpt2-124m
// (model/gpt_config's: 12 layers, C 768, 12 heads = 12 KV groups, F 2048, V 50304, tied) and
// tinyllama-1.1b (22 layers, C 2048, 32 heads, 4 KV groups, F 5632, V 32000, untied).
std::vector<std::string> PresetNames();

// The preset called `name`, at tensor-parallel size `tp` (1: the whole model; shapes tp-local
// otherwise, each param's tp set with rank 0, every rank's shapes being the same).
// Errors: kInvalidArgument naming `name` and the known presets; for tp < 1 or tp > 2^20, or a tp
// that does not divide the KV groups (QKV is split by whole groups), the FFN width (dense or
// expert), or the vocabulary (no padding), a message naming the preset, the quantity and tp.
absl::StatusOr<std::vector<ParamSpec>> PresetParams(absl::string_view name, int tp = 1);

// The fused weights of preset `name` and their logical matrices for Muon, by param name, for the
// GLOBAL shapes (as the trainer passes them to the optimizer): every QKV {KV, {H/KV·D, D, D}} and
// every fc1 {1, {F, F}} (experts' too). Errors: kInvalidArgument for an unknown name.
absl::StatusOr<std::map<std::string, FusedBlocks>> PresetSplits(absl::string_view name);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_PRESETS_H_
