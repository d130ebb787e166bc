#include "model/param_shapes.h"

#include <functional>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::model {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

// The params a checkpoint of `config` holds (fp32).
std::vector<SavedParam> ParamsOf(const GptConfig& config) {
  std::vector<SavedParam> params;
  for (const ParamShape& p : GptParamShapes(config)) params.push_back({p.name, "F32", p.shape});
  return params;
}

SavedModel Saved(const char* preset) {
  SavedModel saved;
  saved.preset = preset;
  saved.config = *GptPreset(preset);
  saved.seq_len = saved.config.max_seq_len;
  return saved;
}

// A checkpoint of `preset` whose recorded config `change` edits is refused with `message`.
void ExpectRefusedWhenChanged(const char* preset, const std::function<void(GptConfig&)>& change,
                              const std::string& message) {
  SavedModel saved = Saved(preset);
  const std::vector<SavedParam> params = ParamsOf(saved.config);
  change(saved.config);
  EXPECT_THAT(CheckSavedParams(saved, params),
              StatusIs(absl::StatusCode::kInvalidArgument, message))
      << preset;
}

TEST(GptParamShapesTest, CountsMatchGptParamCount) {
  for (const char* preset : {"tiny", "small", "gpt2-124m", "tinyllama-1.1b", "moe-tiny",
                             "moe-tiny-shared", "moe-small"}) {
    const GptConfig c = *GptPreset(preset);
    int64_t n = 0;
    for (const ParamShape& p : GptParamShapes(c)) {
      int64_t elems = 1;
      for (int64_t d : p.shape) elems *= d;
      n += elems;
      EXPECT_EQ(p.dim_from.size(), p.shape.size()) << p.name;
    }
    EXPECT_EQ(n, GptParamCount(c)) << preset;
  }
}

TEST(CheckSavedParamsTest, AcceptsTheParamsOfItsConfig) {
  for (const char* preset : {"tiny", "small", "tinyllama-1.1b", "moe-tiny-shared"}) {
    const SavedModel saved = Saved(preset);
    EXPECT_OK(CheckSavedParams(saved, ParamsOf(saved.config))) << preset;
  }
}

// (a) A vocabulary far larger than the embedding (the crafted manifest of issue 41).
TEST(CheckSavedParamsTest, RefusesAVocabularyTheEmbeddingContradicts) {
  ExpectRefusedWhenChanged("tiny", [](GptConfig& c) { c.vocab_size = 99999999999999; },
                           "vocab_size 99999999999999 contradicts param 'embedding.weight' "
                           "[256, 64], which the config makes [99999999999999, 64]");
}

// (b) More blocks than the checkpoint holds.
TEST(CheckSavedParamsTest, RefusesADepthLargerThanTheBlocksPresent) {
  const SavedModel saved = Saved("tiny");
  std::vector<SavedParam> params;
  for (const SavedParam& p : ParamsOf(saved.config)) {
    if (p.name.rfind("layers.1.", 0) != 0) params.push_back(p);
  }
  EXPECT_THAT(CheckSavedParams(saved, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "num_layers 2 needs param 'layers.1.attn_norm.weight', which the "
                       "checkpoint does not have"));
}

// (c) A width the tensors contradict: small's config beside tiny's tensors (same vocabulary).
TEST(CheckSavedParamsTest, RefusesAWidthTheTensorsContradict) {
  EXPECT_THAT(CheckSavedParams(Saved("small"), ParamsOf(*GptPreset("tiny"))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "hidden 256 contradicts param 'embedding.weight' [256, 64], which the "
                       "config makes [256, 256]"));
}

// (d) Heads that do not divide the width.
TEST(CheckSavedParamsTest, RefusesHeadsThatDoNotDivideTheWidth) {
  SavedModel saved = Saved("tiny");
  const std::vector<SavedParam> params = ParamsOf(saved.config);
  saved.config.num_heads = 3;
  saved.config.num_kv_heads = 3;
  EXPECT_THAT(CheckSavedParams(saved, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GptConfig: hidden 64 is not divisible by num_heads 3"));
  // Heads that divide the width but not as saved: the fused QKV rows say so.
  saved.config.num_heads = 8;
  saved.config.num_kv_heads = 2;
  EXPECT_THAT(CheckSavedParams(saved, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "(num_heads + 2 * num_kv_heads) * head_dim (num_heads 8, num_kv_heads 2, "
                       "head_dim 8) contradicts param 'layers.0.attn.qkv.weight' [192, 64], which "
                       "the config makes [96, 64]"));
}

TEST(CheckSavedParamsTest, RefusesOtherContradictions) {
  const SavedModel tiny = Saved("tiny");
  const std::vector<SavedParam> params = ParamsOf(tiny.config);
  SavedModel wide_ffn = tiny;
  wide_ffn.config.ffn_hidden = 100;
  EXPECT_THAT(CheckSavedParams(wide_ffn, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 * ffn_hidden 100 contradicts param 'layers.0.mlp.fc1.weight' "
                                 "[384, 64]")));
  SavedModel untied = tiny;
  untied.config.tie_embeddings = false;
  EXPECT_THAT(CheckSavedParams(untied, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tie_embeddings false needs param 'output_layer.weight', which the "
                       "checkpoint does not have"));
  std::vector<SavedParam> with_head = params;
  with_head.push_back({"output_layer.weight", "F32", {256, 64}});
  EXPECT_THAT(CheckSavedParams(tiny, with_head),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'output_layer.weight' [256, 64] is not one of the config's "
                       "(num_layers 2, num_experts 0, moe_shared_ffn_hidden 0, tie_embeddings "
                       "true)"));
  SavedModel bf16 = tiny;
  bf16.precision = "bf16";
  EXPECT_THAT(CheckSavedParams(bf16, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "precision bf16 contradicts param 'embedding.weight' of F32, expected "
                       "BF16"));
  SavedModel long_seq = tiny;
  long_seq.seq_len = 65;
  EXPECT_THAT(CheckSavedParams(long_seq, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "seq_len 65 is more than the model's max_seq_len 64"));
  SavedModel huge = tiny;
  huge.config.vocab_size = int64_t{1} << 61;
  EXPECT_THAT(CheckSavedParams(huge, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "vocab_size 2305843009213693952 is implausible (more than 2^60)"));
}

TEST(CheckSavedParamsTest, RefusesAnExpertCountTheTensorsContradict) {
  ExpectRefusedWhenChanged("moe-tiny", [](GptConfig& c) { c.num_experts = 16; },
                           "num_experts 16 contradicts param 'layers.0.mlp.router.weight' [8, 64], "
                           "which the config makes [16, 64]");
}

}  // namespace
}  // namespace orthoshard::model
