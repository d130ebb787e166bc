// Named model parameter lists for planning without a spec file: the reference GPT of issue 3 and
// models that exercise GQA shapes and MoE experts. Params come in forward (model-definition) order
// with Megatron's names and routing (2-D hidden matrices → Muon, everything else → Adam).
#ifndef ORTHOSHARD_LAYOUT_PRESETS_H_
#define ORTHOSHARD_LAYOUT_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/layout.h"

namespace orthoshard::layout {

// "gpt8b": hidden 4096, MHA qkv 12288x4096, proj 4096x4096, SwiGLU fc1 32768x4096, fc2
// 4096x16384, 32 layers, untied embedding and output 128256x4096, two norms per layer and a final
// norm; all bf16.
std::vector<ParamSpec> Gpt8bParams();

// "llama3_8b_gqa": like gpt8b with grouped-query attention (32 heads, 8 KV groups: qkv
// 6144x4096) and fc1 28672x4096 / fc2 4096x14336.
std::vector<ParamSpec> Llama3GqaParams();

// "moe_60x256": 60 layers, hidden 2048, GQA attention (qkv 3072x2048, proj 2048x2048), a router
// 256x2048 and 256 experts per layer as separate params (fc1 1536x2048, fc2 2048x768, expert),
// tied (shared) embedding 151936x2048. 31,022 params.
std::vector<ParamSpec> Moe60x256Params();

// Names accepted by PresetParams, in a stable order.
std::vector<std::string> PresetNames();

// The preset called `name`. Errors: kInvalidArgument naming `name` and the known presets.
absl::StatusOr<std::vector<ParamSpec>> PresetParams(absl::string_view name);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_PRESETS_H_
