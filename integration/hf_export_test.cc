#include "integration/hf_export.h"

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::model::FormatSavedModel;
using ::orthoshard::model::ParseSavedModel;
using ::orthoshard::model::SavedModel;
using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// The untied grouped-query case (no preset small enough for the interop test has it): q/k/v rows
// per KV group, gate/up halves, lm_head present, and the config saying so.
TEST(LlamaExportMapping, UntiedGroupedQuery) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved,
                       ParseSavedModel("model=tinyllama-1.1b seq_len=2048 vocab=32001"));
  EXPECT_EQ(saved.config.vocab_size, 32001);
  EXPECT_EQ(FormatSavedModel(saved), "model=tinyllama-1.1b seq_len=2048 vocab=32001");
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, LlamaExportMapping(saved, ""));
  std::map<std::string, checkpoint::ExportTensor> by_name;
  for (const checkpoint::ExportTensor& t : mapping.tensors) by_name[t.name] = t;
  // 22 layers x 9 + embedding + final norm + lm_head.
  EXPECT_EQ(mapping.tensors.size(), 22u * 9 + 3);
  // H 32, KV 4, D 64: a group is (8 + 2) x 64 = 640 rows; its 512 query rows, then k, then v.
  const checkpoint::ExportTensor& q = by_name["model.layers.3.self_attn.q_proj.weight"];
  EXPECT_EQ(q.source, "layers.3.attn.qkv.weight");
  EXPECT_THAT(q.rows, ElementsAre(Pair(0, 512), Pair(640, 512), Pair(1280, 512), Pair(1920, 512)));
  EXPECT_THAT(by_name["model.layers.3.self_attn.k_proj.weight"].rows,
              ElementsAre(Pair(512, 64), Pair(1152, 64), Pair(1792, 64), Pair(2432, 64)));
  EXPECT_THAT(by_name["model.layers.3.self_attn.v_proj.weight"].rows,
              ElementsAre(Pair(576, 64), Pair(1216, 64), Pair(1856, 64), Pair(2496, 64)));
  EXPECT_THAT(by_name["model.layers.0.mlp.gate_proj.weight"].rows, ElementsAre(Pair(0, 5632)));
  EXPECT_THAT(by_name["model.layers.0.mlp.up_proj.weight"].rows, ElementsAre(Pair(5632, 5632)));
  EXPECT_EQ(by_name["lm_head.weight"].source, "output_layer.weight");
  const std::string& config = mapping.files["config.json"];
  EXPECT_THAT(config, HasSubstr("\"num_key_value_heads\": 4,"));
  EXPECT_THAT(config, HasSubstr("\"tie_word_embeddings\": false,"));
  EXPECT_THAT(config, HasSubstr("\"vocab_size\": 32001,"));
  EXPECT_THAT(config, HasSubstr("\"dtype\": \"float32\""));
  EXPECT_EQ(mapping.files.count("tokenizer.json"), 0u);
}

TEST(LlamaExportMapping, TiedHasNoHeadAndBadTokenizerIsNamed) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved, ParseSavedModel("model=tiny seq_len=64 precision=bf16"));
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, LlamaExportMapping(saved, ""));
  for (const checkpoint::ExportTensor& t : mapping.tensors) EXPECT_NE(t.name, "lm_head.weight");
  EXPECT_THAT(mapping.files["config.json"], HasSubstr("\"dtype\": \"bfloat16\""));
  EXPECT_THAT(LlamaExportMapping(saved, "/no/such/tokenizer.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tokenizer '/no/such/tokenizer.json': no such file")));
  ASSERT_OK_AND_ASSIGN(SavedModel documents,
                       ParseSavedModel("model=tiny seq_len=64 documents=eod0,reset,mask_loss"));
  EXPECT_EQ(documents.documents, "eod0,reset,mask_loss");
  EXPECT_EQ(FormatSavedModel(documents), "model=tiny seq_len=64 documents=eod0,reset,mask_loss");
  ASSERT_OK_AND_ASSIGN(SavedModel indexed, ParseSavedModel("model=tiny seq_len=64 documents=index,reset"));
  EXPECT_EQ(indexed.documents, "index,reset");
  EXPECT_EQ(FormatSavedModel(indexed), "model=tiny seq_len=64 documents=index,reset");
  EXPECT_THAT(ParseSavedModel("model=tiny seq_len=64 documents=index"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("documents=index")));
  EXPECT_THAT(ParseSavedModel("model=tiny"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected model=<preset>")));
  EXPECT_THAT(ParseSavedModel("model=tiny seq_len=64 colour=red"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"colour=red\"")));
}

}  // namespace
}  // namespace orthoshard::integration
