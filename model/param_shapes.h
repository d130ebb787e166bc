// The params a GptConfig implies, as names and whole shapes (no LibTorch, nothing allocated), and
// the check that a saved model's config agrees with the params a checkpoint holds: the reader of
// a checkpoint's model config runs it before it builds, allocates or writes anything from that
// config (a crafted manifest can carry any config beside any tensors).
#ifndef ORTHOSHARD_MODEL_PARAM_SHAPES_H_
#define ORTHOSHARD_MODEL_PARAM_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/gpt_config.h"

namespace orthoshard::model {

// One param of a model of a config: the order, names and whole (tp 1, every expert) shapes of
// model.h's file comment, which Gpt's params follow (model_test checks they agree).
struct ParamShape {
  std::string name;
  std::vector<int64_t> shape;
  // Per dimension, the config fields it follows from with their values, e.g. "vocab_size 256" or
  // "2 * ffn_hidden (ffn_hidden 192)".
  std::vector<std::string> dim_from;
  // The field that makes the param exist, e.g. "num_layers 2" for a block's params; "" for a param
  // every model has.
  std::string exists_from;
};

// Every param of a model of `config`. Precondition: ValidateConfig(config) is OK.
std::vector<ParamShape> GptParamShapes(const GptConfig& config);

// A param as a checkpoint holds it (whole: tp slices assembled).
struct SavedParam {
  std::string name;
  std::string dtype;  // safetensors dtype name
  std::vector<int64_t> shape;
};

// Checks that `saved` describes exactly `params`: its config is valid with no size above 2^60,
// every param of GptParamShapes(saved.config) is in `params` with its shape and the dtype of
// saved.precision (F32 for fp32, BF16 for bf16), no other param is, and seq_len is at most the
// config's max_seq_len. Errors: kInvalidArgument naming the field, its value and the param shape
// it contradicts, e.g. "vocab_size 99999999999999 contradicts param 'embedding.weight' [256, 64]
// (dim 0 is vocab_size 99999999999999)"; for a missing param "num_layers 4 needs param
// 'layers.2.attn_norm.weight', which the checkpoint does not have"; for an extra one "param
// 'output_layer.weight' [256, 64] is not one of the config's (tie_embeddings true, ...)"; those
// of ValidateConfig.
absl::Status CheckSavedParams(const SavedModel& saved, const std::vector<SavedParam>& params);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_PARAM_SHAPES_H_
