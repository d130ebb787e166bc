#include "integration/hf_export.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::model::FormatSavedModel;
using ::orthoshard::model::ParseSavedModel;
using ::orthoshard::model::SavedModel;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

using ::orthoshard::testing::TempDir;

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  return path;
}

// A tokenizer.json as Hugging Face tokenizers writes it: BPE over 4 ids, id 3 an added token.
constexpr char kTokenizerJson[] = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 3, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
  "post_processor": null, "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
            "vocab": {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}, "merges": [["a", "b"]]}
})";

// The untied grouped-query case (no preset small enough for the interop test has it): q/k/v rows
// per KV group, gate/up halves, lm_head present, and the config saying so.
TEST(HfExportMapping, UntiedGroupedQuery) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved,
                       ParseSavedModel("model=tinyllama-1.1b seq_len=2048 vocab=32001"));
  EXPECT_EQ(saved.config.vocab_size, 32001);
  EXPECT_EQ(FormatSavedModel(saved), "model=tinyllama-1.1b seq_len=2048 vocab=32001");
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, HfExportMapping(saved, ""));
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

// moe-small (8 experts of F_e 352, top-2, tied, no shared expert) as Mixtral: the router as
// block_sparse_moe.gate, each expert's fc1 gate rows as w1 and up rows as w3, fc2 as w2; no dense
// MLP names; the config's expert fields (transformers 5.24's MixtralConfig).
TEST(HfExportMapping, MoeWithoutSharedExpertIsMixtral) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved, ParseSavedModel("model=moe-small seq_len=256"));
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, HfExportMapping(saved, ""));
  std::map<std::string, checkpoint::ExportTensor> by_name;
  for (const checkpoint::ExportTensor& t : mapping.tensors) by_name[t.name] = t;
  // Per layer 6 attention and norm tensors, the router, 8 x 3 expert tensors; embedding and final
  // norm (tied: no head).
  EXPECT_EQ(mapping.tensors.size(), 4u * (6 + 1 + 8 * 3) + 2);
  const std::string moe = "model.layers.2.block_sparse_moe.";
  EXPECT_EQ(by_name[moe + "gate.weight"].source, "layers.2.mlp.router.weight");
  EXPECT_TRUE(by_name[moe + "gate.weight"].rows.empty());
  EXPECT_EQ(by_name[moe + "experts.5.w1.weight"].source, "layers.2.mlp.experts.5.fc1.weight");
  EXPECT_THAT(by_name[moe + "experts.5.w1.weight"].rows, ElementsAre(Pair(0, 352)));
  EXPECT_EQ(by_name[moe + "experts.5.w3.weight"].source, "layers.2.mlp.experts.5.fc1.weight");
  EXPECT_THAT(by_name[moe + "experts.5.w3.weight"].rows, ElementsAre(Pair(352, 352)));
  EXPECT_EQ(by_name[moe + "experts.7.w2.weight"].source, "layers.2.mlp.experts.7.fc2.weight");
  EXPECT_EQ(by_name.count("model.layers.2.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
  const std::string& config = mapping.files["config.json"];
  EXPECT_THAT(config, HasSubstr("\"architectures\": [\"MixtralForCausalLM\"]"));
  EXPECT_THAT(config, HasSubstr("\"model_type\": \"mixtral\","));
  EXPECT_THAT(config, HasSubstr("\"intermediate_size\": 352,"));
  EXPECT_THAT(config, HasSubstr("\"num_local_experts\": 8,"));
  EXPECT_THAT(config, HasSubstr("\"num_experts_per_tok\": 2,"));
  EXPECT_THAT(config, HasSubstr("\"sliding_window\": null,"));
  EXPECT_THAT(config, HasSubstr("\"output_router_logits\": false,"));
  EXPECT_THAT(config, HasSubstr("\"router_aux_loss_coef\": 0.01,"));
  EXPECT_THAT(config, HasSubstr("\"tie_word_embeddings\": true,"));
  // A top-k other than the preset's is exported as saved.
  ASSERT_OK_AND_ASSIGN(SavedModel top1, ParseSavedModel("model=moe-tiny seq_len=64 top_k=1"));
  ASSERT_OK_AND_ASSIGN(mapping, HfExportMapping(top1, ""));
  EXPECT_THAT(mapping.files["config.json"], HasSubstr("\"num_experts_per_tok\": 1,"));
}

// moe-tiny-shared (a shared expert under a sigmoid gate) as Qwen2-MoE: mlp.gate, the experts' and
// the shared expert's gate/up/down projections, mlp.shared_expert_gate; no q/k/v biases
// (qkv_bias false), top-k renormalised (norm_topk_prob), every layer sparse.
TEST(HfExportMapping, MoeWithSharedExpertIsQwen2Moe) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved, ParseSavedModel("model=moe-tiny-shared seq_len=64"));
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, HfExportMapping(saved, ""));
  std::map<std::string, checkpoint::ExportTensor> by_name;
  for (const checkpoint::ExportTensor& t : mapping.tensors) by_name[t.name] = t;
  // Per layer 6 + router + 8 x 3 experts + 3 shared + its gate; embedding and final norm (tied).
  EXPECT_EQ(mapping.tensors.size(), 4u * (6 + 1 + 8 * 3 + 3 + 1) + 2);
  const std::string mlp = "model.layers.1.mlp.";
  EXPECT_EQ(by_name[mlp + "gate.weight"].source, "layers.1.mlp.router.weight");
  EXPECT_THAT(by_name[mlp + "experts.3.gate_proj.weight"].rows, ElementsAre(Pair(0, 64)));
  EXPECT_THAT(by_name[mlp + "experts.3.up_proj.weight"].rows, ElementsAre(Pair(64, 64)));
  EXPECT_EQ(by_name[mlp + "experts.3.down_proj.weight"].source,
            "layers.1.mlp.experts.3.fc2.weight");
  EXPECT_EQ(by_name[mlp + "shared_expert.gate_proj.weight"].source,
            "layers.1.mlp.shared_expert.fc1.weight");
  EXPECT_THAT(by_name[mlp + "shared_expert.up_proj.weight"].rows, ElementsAre(Pair(64, 64)));
  EXPECT_EQ(by_name[mlp + "shared_expert.down_proj.weight"].source,
            "layers.1.mlp.shared_expert.fc2.weight");
  EXPECT_EQ(by_name[mlp + "shared_expert_gate.weight"].source,
            "layers.1.mlp.shared_expert_gate.weight");
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
  const std::string& config = mapping.files["config.json"];
  EXPECT_THAT(config, HasSubstr("\"architectures\": [\"Qwen2MoeForCausalLM\"]"));
  EXPECT_THAT(config, HasSubstr("\"model_type\": \"qwen2_moe\","));
  EXPECT_THAT(config, HasSubstr("\"num_experts\": 8,"));
  EXPECT_THAT(config, HasSubstr("\"moe_intermediate_size\": 64,"));
  EXPECT_THAT(config, HasSubstr("\"shared_expert_intermediate_size\": 64,"));
  EXPECT_THAT(config, HasSubstr("\"norm_topk_prob\": true,"));
  EXPECT_THAT(config, HasSubstr("\"decoder_sparse_step\": 1,"));
  EXPECT_THAT(config, HasSubstr("\"mlp_only_layers\": [],"));
  EXPECT_THAT(config, HasSubstr("\"qkv_bias\": false,"));
  EXPECT_THAT(config, HasSubstr("\"tie_word_embeddings\": true,"));
  EXPECT_THAT(config, Not(HasSubstr("head_dim")));
}

TEST(HfExportMapping, TiedHasNoHeadAndBadTokenizerIsNamed) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved, ParseSavedModel("model=tiny seq_len=64 precision=bf16"));
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, HfExportMapping(saved, ""));
  for (const checkpoint::ExportTensor& t : mapping.tensors) EXPECT_NE(t.name, "lm_head.weight");
  EXPECT_THAT(mapping.files["config.json"], HasSubstr("\"dtype\": \"bfloat16\""));
  EXPECT_THAT(HfExportMapping(saved, "/no/such/tokenizer.json"),
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

// The checkpoint's end-of-document token is eos (and bos) in config.json and generation_config.json;
// without one they are null and there is no generation_config.json.
TEST(HfExportMapping, EodTokenIsEosWhenTheCheckpointKnowsIt) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved,
                       ParseSavedModel("model=tiny seq_len=64 documents=eod7,reset,mask_loss"));
  ASSERT_OK_AND_ASSIGN(const int64_t eod, SavedEodToken(saved));
  EXPECT_EQ(eod, 7);
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, HfExportMapping(saved, ""));
  EXPECT_THAT(mapping.files["config.json"], HasSubstr("  \"bos_token_id\": 7,\n  \"eos_token_id\": 7,\n"));
  EXPECT_THAT(mapping.files["config.json"],
              HasSubstr("\"orthoshard_model\": \"model=tiny seq_len=64 documents=eod7,reset,mask_loss\"\n}\n"));
  EXPECT_EQ(mapping.files["generation_config.json"],
            "{\n  \"bos_token_id\": 7,\n  \"eos_token_id\": 7\n}\n");

  ASSERT_OK_AND_ASSIGN(SavedModel plain, ParseSavedModel("model=tiny seq_len=64"));
  ASSERT_OK_AND_ASSIGN(const int64_t none, SavedEodToken(plain));
  EXPECT_EQ(none, -1);
  ASSERT_OK_AND_ASSIGN(mapping, HfExportMapping(plain, ""));
  EXPECT_THAT(mapping.files["config.json"], HasSubstr("\"eos_token_id\": null,"));
  EXPECT_EQ(mapping.files.count("generation_config.json"), 0u);

  for (const char* documents : {"eodx", "eod-1", "eod999999"}) {
    ASSERT_OK_AND_ASSIGN(SavedModel bad,
                         ParseSavedModel(std::string("model=tiny seq_len=64 documents=") + documents));
    EXPECT_THAT(HfExportMapping(bad, ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string("documents=") + documents + " does not start with eod<id>")));
  }
}

// A tokenizer.json file is copied only when it has the structure tokenizers reads, ids within the
// model's vocabulary and a token at the checkpoint's end-of-document id, which becomes eos_token.
TEST(HfExportMapping, TokenizerFileIsCheckedAndNamesTheEosToken) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved, ParseSavedModel("model=tiny seq_len=64 documents=eod3"));
  const std::string good = WriteTemp("good_tokenizer.json", kTokenizerJson);
  ASSERT_OK_AND_ASSIGN(checkpoint::ExportMapping mapping, HfExportMapping(saved, good));
  EXPECT_EQ(mapping.files["tokenizer.json"], kTokenizerJson);
  EXPECT_EQ(mapping.files["tokenizer_config.json"],
            "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n"
            "  \"clean_up_tokenization_spaces\": false,\n"
            "  \"bos_token\": \"<|endoftext|>\",\n  \"eos_token\": \"<|endoftext|>\"\n}\n");

  EXPECT_THAT(HfExportMapping(saved, TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("': not a prepared data directory: ")));
  ASSERT_OK_AND_ASSIGN(SavedModel other_eod, ParseSavedModel("model=tiny seq_len=64 documents=eod9"));
  EXPECT_THAT(HfExportMapping(other_eod, good),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("good_tokenizer.json': has no token with id 9, the checkpoint's "
                                 "end-of-document token")));
  ASSERT_OK_AND_ASSIGN(SavedModel small_vocab, ParseSavedModel("model=tiny seq_len=64 vocab=3"));
  EXPECT_THAT(HfExportMapping(small_vocab, good),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("its token ids go up to 3, past the model's vocabulary of 3")));
}

TEST(CheckTokenizerJson, NamesWhatIsMissing) {
  struct Case {
    std::string json;
    const char* error;
  };
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  for (const Case& c : std::vector<Case>{
           {"PK\x03\x04 not json", "not JSON ("},
           {"[1, 2]", "the top level is not a JSON object"},
           {"{" + model + "}", "no \"version\": \"1.0\""},
           {R"({"version": "2.0", )" + model + "}", "no \"version\": \"1.0\""},
           {R"({"version": "1.0"})", "no model object"},
           {R"({"version": "1.0", "model": []})", "no model object"},
           {R"({"version": "1.0", "model": {"type": "BPE"}})", "no model.vocab"},
           {R"({"version": "1.0", "model": {"type": "Magic", "vocab": {}}})",
            "model.type is not one of BPE"},
           {R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}})",
            "BPE model has no merges array"},
           {R"({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": -1}}})",
            "model.vocab maps 'a' to something not a token id"},
           {R"({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 1.5}}})",
            "model.vocab maps 'a' to something not a token id"},
           {R"({"version": "1.0", "model": {"type": "Unigram", "vocab": {"a": 0}}})",
            "Unigram model.vocab is not an array"},
           {R"({"version": "1.0", "model": {"type": "Unigram", "vocab": [["a", -1.0], ["b"]]}})",
            "Unigram model.vocab[1] is not [token, score]"},
           {R"({"version": "1.0", "model": {"type": "WordLevel", "vocab": {}}})", "an empty vocabulary"},
           {R"({"version": "1.0", "decoder": 3, )" + model + "}",
            "decoder is neither null nor an object"},
           {R"({"version": "1.0", "added_tokens": [{"id": 1}], )" + model + "}",
            "added_tokens[0] is not {\"id\": ID, \"content\": TEXT, ...}"},
       }) {
    EXPECT_THAT(CheckTokenizerJson("t.json", c.json),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("--tokenizer 't.json': not a Hugging Face tokenizer.json: "),
                               HasSubstr(c.error))))
        << c.json;
  }
  ASSERT_OK_AND_ASSIGN(TokenizerJsonInfo unigram, CheckTokenizerJson("t.json", R"({
      "version": "1.0", "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["a", -1.5]]},
      "added_tokens": [{"id": 5, "content": "<eod>"}]})"));
  EXPECT_EQ(unigram.id_count, 6);
  EXPECT_EQ(unigram.tokens[1], "a");
  EXPECT_EQ(unigram.tokens[5], "<eod>");
  ASSERT_OK_AND_ASSIGN(TokenizerJsonInfo bpe, CheckTokenizerJson("t.json", kTokenizerJson));
  EXPECT_EQ(bpe.id_count, 4);
  EXPECT_THAT(bpe.tokens, Not(::testing::IsEmpty()));
}

// kTokenizerJson with its model's merges replaced by `merges` (JSON text).
std::string WithMerges(const std::string& merges, const std::string& prefix = "null") {
  std::string json = kTokenizerJson;
  const std::string old_merges = R"("merges": [["a", "b"]])";
  json.replace(json.find(old_merges), old_merges.size(),
               "\"continuing_subword_prefix\": " + prefix + ", \"merges\": " + merges);
  return json;
}

// Each merge as tokenizers' BpeBuilder::build checks it (tokenizers 0.23.3's Tokenizer.from_str
// refuses every file below, with an error or a panic, and loads the accepted ones).
TEST(CheckTokenizerJson, MergesNameVocabularyTokens) {
  struct Case {
    std::string merges;
    std::string prefix;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {R"([["x", "b"]])", "null", "model.merges[0] merges 'x' and 'b', but 'x' is not in model.vocab"},
           {R"([["a", "b"], ["a", "y"]])", "null", "model.merges[1] merges 'a' and 'y', but 'y' is not"},
           {R"([["b", "a"]])", "null", "model.merges[0] merges 'b' and 'a' into 'ba', which is not in model.vocab"},
           // Added tokens are not the model's vocabulary.
           {R"([["a", "<|endoftext|>"]])", "null", "into 'a<|endoftext|>', which is not in model.vocab"},
           {R"(["a b c"])", "null", "model.merges[0] \"a b c\" is not \"A B\" (one space)"},
           {R"(["ab"])", "null", "model.merges[0] \"ab\" is not \"A B\" (one space)"},
           {R"([["a", "b", "c"]])", "null", "model.merges[0] is neither \"A B\" nor [\"A\", \"B\"]"},
           {R"([[0, 1]])", "null", "model.merges[0] is neither"},
           {R"({"a": "b"})", "null", "BPE model has no merges array"},
           // The prefix is cut from B whatever B starts with: "a" + "b"[2:] would panic in tokenizers.
           {R"([["a", "b"]])", "\"##\"", "model.merges[0]: 'b' is shorter than model.continuing_subword_prefix"},
       }) {
    EXPECT_THAT(CheckTokenizerJson("t.json", WithMerges(c.merges, c.prefix)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("--tokenizer 't.json': not a Hugging Face tokenizer.json: "),
                               HasSubstr(c.error))))
        << c.merges;
  }
  EXPECT_OK(CheckTokenizerJson("t.json", WithMerges(R"(["a b"])")));
  EXPECT_OK(CheckTokenizerJson("t.json", WithMerges("[]")));
  // With the prefix "##": "a" + "ab"[2:] is "a", in the vocabulary (tokenizers loads it).
  EXPECT_OK(CheckTokenizerJson("t.json", WithMerges(R"([["a", "ab"]])", "\"##\"")));
  // Without "type" tokenizers tries BPE first, so its merges are checked too.
  std::string untyped = WithMerges(R"([["b", "a"]])");
  untyped.erase(untyped.find(R"("type": "BPE", )"), std::string(R"("type": "BPE", )").size());
  EXPECT_THAT(CheckTokenizerJson("t.json", untyped),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("into 'ba', which is not")));
}

// A deeply nested file (400 kB) is refused at the nesting limit in one pass; protobuf's parser alone
// takes time quadratic in the depth (half an hour or more here). The test's timeout catches a hang.
TEST(CheckTokenizerJson, DeepNestingIsRefusedAtTheLimit) {
  std::string deep = kTokenizerJson;
  const std::string nested = std::string(200000, '[') + std::string(200000, ']');
  deep.replace(deep.find("\"padding\": null"), 15, "\"padding\": " + nested);
  EXPECT_THAT(CheckTokenizerJson("t.json", deep),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a Hugging Face tokenizer.json: not JSON (JSON nests deeper "
                                 "than 32 levels at byte ")));
  // 32 levels parse (top-level object + 31 arrays).
  std::string at_limit = kTokenizerJson;
  at_limit.replace(at_limit.find("\"padding\": null"), 15,
                   "\"truncation_x\": " + std::string(31, '[') + std::string(31, ']') + ", \"padding\": null");
  EXPECT_OK(CheckTokenizerJson("t.json", at_limit));
}

TEST(CheckTokenizerJson, DuplicateKeyIsRefused) {
  std::string twice = kTokenizerJson;
  twice.replace(twice.find("\"ab\": 2"), 7, "\"ab\": 2, \"a\": 5");
  EXPECT_THAT(CheckTokenizerJson("t.json", twice),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not JSON (JSON object has the key \"a\" twice (byte ")));
}

// A FIFO given as the tokenizer is refused at once, not opened for a writer that never comes.
TEST(HfExportMapping, TokenizerThatIsAFifoIsRefused) {
  ASSERT_OK_AND_ASSIGN(SavedModel saved, ParseSavedModel("model=tiny seq_len=64 documents=eod3"));
  const std::string fifo = TempDir() + "/tokenizer_fifo.json";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(HfExportMapping(saved, fifo),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tokenizer '" + fifo + "' cannot be read: open(" + fifo +
                                 "): a FIFO, expected a regular file")));
}

}  // namespace
}  // namespace orthoshard::integration
