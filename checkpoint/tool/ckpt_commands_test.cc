#include "checkpoint/tool/ckpt_commands.h"

#include <sys/wait.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/internal/json.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/testing/test_checkpoint.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::checkpoint::testing::RecordBytes;
using ::orthoshard::checkpoint::testing::ScratchDir;
using ::orthoshard::checkpoint::testing::SmallModel;
using ::orthoshard::checkpoint::testing::TestTensor;
using ::orthoshard::checkpoint::testing::WriteTestCheckpoint;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::Status RunCkpt(const std::vector<std::string>& args, std::string* output = nullptr) {
  absl::StatusOr<CkptCommand> command = ParseCkptArgs(args);
  if (!command.ok()) return command.status();
  std::ostringstream out;
  absl::Status status = RunCkptCommand(*command, out);
  if (output != nullptr) *output = out.str();
  return status;
}

// Flips one bit of the first data byte of tensor `key` in `file`.
void FlipBit(const std::string& file, const std::string& key) {
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(file);
  ASSERT_OK(reader.status());
  const TensorEntry* entry = reader->Find(key);
  ASSERT_NE(entry, nullptr);
  uint64_t offset = reader->data_start() + entry->begin;
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadFileToString(file));
  bytes[offset] ^= 0x10;
  ASSERT_OK(WriteFileAtomically(file, bytes));
}

TEST(CkptArgsTest, ParsesCommands) {
  ASSERT_OK_AND_ASSIGN(CkptCommand c, ParseCkptArgs({"export", "d", "--to=o",
                                                     "--max_shard_bytes=100"}));
  EXPECT_EQ(c.verb, CkptCommand::Verb::kExport);
  EXPECT_EQ(c.dir, "d");
  EXPECT_EQ(c.to, "o");
  EXPECT_EQ(c.max_shard_bytes, 100u);
  ASSERT_OK_AND_ASSIGN(c, ParseCkptArgs({"verify", "d"}));
  EXPECT_EQ(c.verb, CkptCommand::Verb::kVerify);
}

TEST(CkptArgsTest, RejectsBadArguments) {
  struct Case {
    std::vector<std::string> args;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {{}, "missing command"},
           {{"frobnicate", "d"}, "unknown command 'frobnicate'"},
           {{"inspect"}, "inspect needs a checkpoint DIR"},
           {{"verify", "a", "b"}, "unexpected extra argument 'b'"},
           {{"verify", "a", "--to=x"}, "unknown flag '--to=x' for verify"},
           {{"export", "a"}, "export needs --to=OUT"},
           {{"export", "a", "--to="}, "--to= needs an output directory"},
           {{"export", "a", "--to=o", "--max_shard_bytes=0"}, "must be a positive integer, got '0'"},
           {{"export", "a", "--to=o", "--max_shard_bytes=5GB"}, "got '5GB'"},
           {{"export", "a", "--to=o", "--frob"}, "unknown flag '--frob' for export"},
       }) {
    EXPECT_THAT(ParseCkptArgs(c.args),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.error;
  }
}

TEST(CkptBinaryTest, ExitCodes) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 1, SmallModel()));
  auto exit_code = [](const std::string& args) {
    int status = std::system(absl::StrCat("integration/ckpt ", args, " >/dev/null 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(exit_code("bogus"), 2);
  EXPECT_EQ(exit_code("export " + root), 2);
  EXPECT_EQ(exit_code("verify " + root), 0);
  EXPECT_EQ(exit_code("verify " + root + "/nothing_here"), 1);
}

TEST(CkptTest, InspectPrintsTheManifest) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  std::string out;
  ASSERT_OK(RunCkpt({"inspect", root}, &out));
  EXPECT_THAT(out, AllOf(HasSubstr("step 4, 21 tensors in 2 files"),
                         HasSubstr("rank0.safetensors: 12 tensors"),
                         HasSubstr("layout_strategy: \"layerwise\""),
                         HasSubstr("name: \"layers.0.attn.qkv.weight\""),
                         HasSubstr("kind: \"exp_avg\"")));
}

TEST(CkptTest, VerifyPassesAndCatchesABitFlipNamingFileAndTensor) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  std::string out;
  ASSERT_OK(RunCkpt({"verify", root}, &out));
  EXPECT_THAT(out, HasSubstr("all 21 tensors in 2 files verified"));

  const std::string shard = JoinPath(root, "step_000004/rank1.safetensors");
  FlipBit(shard, "layers.0.attn.qkv.weight#exp_avg_sq");
  EXPECT_THAT(RunCkpt({"verify", root}, &out),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("1 of 21 tensors failed")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("FAILED: checkpoint file ", shard,
                                          ": tensor 'layers.0.attn.qkv.weight' (exp_avg_sq): "
                                          "crc32c 0x")));
  // Export reads through the same checks and refuses corrupted params.
  FlipBit(shard, "layers.0.attn.qkv.weight");
  EXPECT_THAT(RunCkpt({"export", root, "--to=" + ScratchDir("_out")}),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat(shard, ": tensor 'layers.0.attn.qkv.weight' (param)"))));
}

TEST(CkptTest, VerifyReportsAMissingShard) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  ASSERT_OK(RemoveRecursively(JoinPath(root, "step_000004/rank0.safetensors")));
  std::string out;
  EXPECT_THAT(RunCkpt({"verify", root}, &out),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("12 of 21 tensors failed")));
  EXPECT_THAT(out, HasSubstr("rank0.safetensors: tensor 'embedding.weight' (param): open("));
}

// Reads back an export and checks it holds exactly the params of `model` at `step`.
void ExpectExportHolds(const std::string& out_dir, const std::vector<std::string>& files,
                       const std::vector<TestTensor>& model, int64_t step) {
  size_t found = 0;
  for (const std::string& file : files) {
    if (file == "model.safetensors.index.json") continue;
    ASSERT_OK_AND_ASSIGN(SafetensorsReader reader,
                         SafetensorsReader::Open(JoinPath(out_dir, file)));
    EXPECT_THAT(reader.header().metadata,
                ElementsAre(std::pair<std::string, std::string>("format", "pt")));
    for (const TestTensor& tensor : model) {
      const TensorEntry* entry = reader.Find(tensor.name);
      if (entry == nullptr) continue;
      ++found;
      EXPECT_EQ(entry->spec.dtype, tensor.dtype);
      EXPECT_EQ(entry->spec.shape, tensor.shape);
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, reader.ReadTensor(tensor.name));
      EXPECT_EQ(bytes, RecordBytes(tensor, kParamKind, step)) << tensor.name;
    }
  }
  EXPECT_EQ(found, model.size());
}

TEST(CkptTest, ExportsOneFileWhenItFits) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  const std::string out_dir = JoinPath(ScratchDir("_out"), "export");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> files,
                       ExportSafetensors(JoinPath(root, "step_000004"), out_dir));
  EXPECT_THAT(files, ElementsAre("model.safetensors"));
  ExpectExportHolds(out_dir, files, SmallModel(), 4);
}

TEST(CkptTest, ExportsHuggingFaceShardsWithAnIndex) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  const std::string out_dir = ScratchDir("_out");
  std::string out;
  // Manifest order is rank0's params then rank1's. With 1024 bytes a shard: [embedding 1024],
  // [fc1 F32 512 + fc1 F16 256 + logit_scale 4], [qkv BF16 384 + norm 32 + bias 64].
  ASSERT_OK(RunCkpt({"export", root, "--to=" + out_dir, "--max_shard_bytes=1024"}, &out));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> files, ListDir(out_dir));
  EXPECT_THAT(files, ElementsAre("model-00001-of-00003.safetensors",
                                 "model-00002-of-00003.safetensors",
                                 "model-00003-of-00003.safetensors",
                                 "model.safetensors.index.json"));
  EXPECT_THAT(out, HasSubstr("model.safetensors.index.json"));
  ExpectExportHolds(out_dir, files, SmallModel(), 4);

  ASSERT_OK_AND_ASSIGN(std::string index_text,
                       ReadFileToString(JoinPath(out_dir, "model.safetensors.index.json")));
  ASSERT_OK_AND_ASSIGN(internal_checkpoint::JsonValue index,
                       internal_checkpoint::ParseJson(index_text));
  uint64_t total = 0;
  for (const TestTensor& t : SmallModel()) total += *TensorByteSize({t.name, t.dtype, t.shape});
  ASSERT_NE(index.Find("metadata"), nullptr);
  EXPECT_EQ(index.Find("metadata")->Find("total_size")->magnitude, total);
  const internal_checkpoint::JsonValue* weight_map = index.Find("weight_map");
  ASSERT_NE(weight_map, nullptr);
  EXPECT_EQ(weight_map->members.size(), SmallModel().size());
  EXPECT_EQ(weight_map->Find("embedding.weight")->string_value, "model-00001-of-00003.safetensors");
  EXPECT_EQ(weight_map->Find("logit_scale")->string_value, "model-00002-of-00003.safetensors");
  EXPECT_EQ(weight_map->Find("final_norm.bias")->string_value, "model-00003-of-00003.safetensors");
}

// Export is all or nothing: a sharded export over a previous single-file one leaves only the
// shards and their index (no stale model.safetensors beside them); an export that fails mid-way
// (a corrupt param in the second of three shards) leaves the previous export byte for byte, with
// no staging directory; a directory holding anything an export does not write is refused untouched.
TEST(CkptTest, ExportReplacesAPreviousExportWholeOrNotAtAll) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  const std::string parent = ScratchDir("_out");
  const std::string out_dir = JoinPath(parent, "export");
  ASSERT_OK(RunCkpt({"export", root, "--to=" + out_dir}));
  ASSERT_OK(RunCkpt({"export", root, "--to=" + out_dir, "--max_shard_bytes=1024"}));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> files, ListDir(out_dir));
  EXPECT_THAT(files, ElementsAre("model-00001-of-00003.safetensors",
                                 "model-00002-of-00003.safetensors",
                                 "model-00003-of-00003.safetensors",
                                 "model.safetensors.index.json"));
  ASSERT_OK(RunCkpt({"export", root, "--to=" + out_dir}));
  ASSERT_OK_AND_ASSIGN(files, ListDir(out_dir));
  EXPECT_THAT(files, ElementsAre("model.safetensors"));
  ASSERT_OK_AND_ASSIGN(const std::string good,
                       ReadFileToString(JoinPath(out_dir, "model.safetensors")));

  // The second shard's first param (fc1, in rank0's file) is corrupt: shard 1 is already written
  // when the export fails.
  FlipBit(JoinPath(root, "step_000004/rank0.safetensors"), "layers.0.mlp.fc1.weight");
  EXPECT_THAT(RunCkpt({"export", root, "--to=" + out_dir, "--max_shard_bytes=1024"}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("layers.0.mlp.fc1.weight")));
  ASSERT_OK_AND_ASSIGN(files, ListDir(out_dir));
  EXPECT_THAT(files, ElementsAre("model.safetensors"));
  ASSERT_OK_AND_ASSIGN(const std::string after,
                       ReadFileToString(JoinPath(out_dir, "model.safetensors")));
  EXPECT_EQ(after, good);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> siblings, ListDir(parent));
  EXPECT_THAT(siblings, ElementsAre("export"));

  ASSERT_OK(WriteFileAtomically(JoinPath(out_dir, "notes.txt"), "mine"));
  EXPECT_THAT(RunCkpt({"export", JoinPath(root, "step_000004"), "--to=" + out_dir}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("holds 'notes.txt', which no export writes")));
  ASSERT_OK_AND_ASSIGN(files, ListDir(out_dir));
  EXPECT_THAT(files, ElementsAre("model.safetensors", "notes.txt"));
}

// A mapped export renames and splits by rows (bytes as saved), writes the mapping's files in the
// same all-or-nothing directory, and refuses a mapping that drops a param, names an absent one or
// takes rows the param lacks.
TEST(CkptTest, MappedExportSplitsRowsAndWritesFiles) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  const std::string step = JoinPath(root, "step_000004");
  ExportMapping mapping;
  for (const TestTensor& t : SmallModel()) {
    if (t.name == "layers.0.attn.qkv.weight") continue;
    mapping.tensors.push_back({"renamed." + t.name, t.name, {}});
  }
  // qkv [24, 8] BF16: "q" = rows 0..3 and 12..15, "kv" = rows 4..11 and 16..23.
  mapping.tensors.push_back({"q", "layers.0.attn.qkv.weight", {{0, 4}, {12, 4}}});
  mapping.tensors.push_back({"kv", "layers.0.attn.qkv.weight", {{4, 8}, {16, 8}}});
  mapping.files["config.json"] = "{\"a\": 1}\n";
  ExportOptions options;
  options.mapping = mapping;
  const std::string out_dir = JoinPath(ScratchDir("_out"), "mapped");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> files, ExportSafetensors(step, out_dir, options));
  EXPECT_THAT(files, ElementsAre("model.safetensors", "config.json"));
  ASSERT_OK_AND_ASSIGN(std::string config, ReadFileToString(JoinPath(out_dir, "config.json")));
  EXPECT_EQ(config, "{\"a\": 1}\n");
  ASSERT_OK_AND_ASSIGN(SafetensorsReader reader,
                       SafetensorsReader::Open(JoinPath(out_dir, "model.safetensors")));
  const TestTensor qkv = SmallModel()[1];
  const std::vector<uint8_t> whole = RecordBytes(qkv, kParamKind, 4);
  const size_t row = 8 * 2;  // 8 BF16 elements
  std::vector<uint8_t> q(whole.begin(), whole.begin() + 4 * row);
  q.insert(q.end(), whole.begin() + 12 * row, whole.begin() + 16 * row);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got_q, reader.ReadTensor("q"));
  EXPECT_EQ(got_q, q);
  EXPECT_THAT(reader.Find("kv")->spec.shape, ElementsAre(16, 8));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got_fc1, reader.ReadTensor("renamed.layers.0.mlp.fc1.weight"));
  EXPECT_EQ(got_fc1, RecordBytes(SmallModel()[2], kParamKind, 4));
  // A second mapped export replaces the first (its config.json counts as an export's file).
  ASSERT_OK(ExportSafetensors(step, out_dir, options).status());

  // Variants of the mapping (edited as plain ExportMappings: GCC 12 warns, wrongly, about
  // editing the vector inside a copied std::optional).
  const auto with = [](ExportMapping m) {
    ExportOptions o;
    o.mapping = std::move(m);
    return o;
  };
  ExportMapping dropped = mapping;
  dropped.tensors.pop_back();  // kv
  dropped.tensors.pop_back();  // q: nothing reads qkv now
  EXPECT_THAT(ExportSafetensors(step, out_dir, with(dropped)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("leaves out param 'layers.0.attn.qkv.weight'")));
  ExportMapping absent = mapping;
  absent.tensors.push_back({"x", "no.such.param", {}});
  EXPECT_THAT(ExportSafetensors(step, out_dir, with(absent)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'x' comes from param 'no.such.param', which the checkpoint "
                                 "does not have")));
  ExportMapping outside = mapping;
  outside.tensors.back().rows = {{20, 8}};
  EXPECT_THAT(ExportSafetensors(step, out_dir, with(outside)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'kv' takes rows [20, 28) of 'layers.0.attn.qkv.weight', which "
                                 "has 24")));
  // The failed attempts left the good export in place.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDir(out_dir));
  EXPECT_THAT(names, ElementsAre("config.json", "model.safetensors"));
  // Without a provider, --format=hf is refused by name.
  EXPECT_THAT(RunCkpt({"export", root, "--to=" + out_dir, "--format=hf"}),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("--format=hf")));
}

TEST(CkptTest, ExportRejectsAZeroShardLimit) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 4, SmallModel()));
  ExportOptions options;
  options.max_shard_bytes = 0;
  EXPECT_THAT(ExportSafetensors(JoinPath(root, "step_000004"), ScratchDir("_out"), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_shard_bytes must be > 0")));
}

}  // namespace
}  // namespace orthoshard::checkpoint
