// Crafted manifests, each with a valid CRC (WriteManifest computes it), whose model config the
// params contradict: CheckpointModel refuses them, and so do `ckpt forward` and `ckpt export
// --format=hf` before they allocate or write anything (exit 2, one line, no export directory).
#include "integration/checkpoint_model.h"

#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/param_shapes.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::testing::StatusIs;

std::string Scratch(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  EXPECT_OK(checkpoint::RemoveRecursively(dir));
  EXPECT_OK(checkpoint::MakeDir(dir));
  return dir;
}

// Writes a checkpoint directory `dir` holding tiny's params (zeros, fp32) except those whose name
// starts with `drop`, under a manifest whose model_config is `model_config`.
void WriteTinyCheckpoint(const std::string& dir, const std::string& model_config,
                         const std::string& drop = "") {
  const std::vector<model::ParamShape> shapes = model::GptParamShapes(*model::GptPreset("tiny"));
  std::vector<std::vector<uint8_t>> bytes;
  bytes.reserve(shapes.size());
  std::vector<checkpoint::RecordData> records;
  for (const model::ParamShape& p : shapes) {
    if (!drop.empty() && p.name.rfind(drop, 0) == 0) continue;
    int64_t elems = 1;
    for (int64_t d : p.shape) elems *= d;
    bytes.emplace_back(4 * elems, 0);
    records.push_back({p.name, checkpoint::kParamKind, "F32", p.shape, bytes.back(), {}});
  }
  absl::StatusOr<std::vector<checkpoint::TensorRecord>> written =
      checkpoint::WriteShard(dir, "rank0.safetensors", records);
  ASSERT_OK(written.status());
  checkpoint::Manifest manifest;
  manifest.set_format_version(checkpoint::kManifestFormatVersion);
  manifest.set_step(1);
  manifest.set_layout_strategy("layerwise");
  manifest.set_dp_size(1);
  manifest.set_tp_size(1);
  manifest.set_model_config(model_config);
  manifest.set_optimizer_config("optimizer=adamw");
  for (const checkpoint::TensorRecord& r : *written) *manifest.add_tensors() = r;
  ASSERT_OK(checkpoint::WriteManifest(dir, manifest));
}

struct Crafted {
  std::string name;
  std::string model_config;
  std::string drop;   // params left out
  std::string error;  // after "checkpoint DIR: model config \"...\": "
};

const std::vector<Crafted>& CraftedCases() {
  static const auto* cases = new std::vector<Crafted>{
      // (a) A huge vocabulary beside tiny's [256, 64] embedding.
      {"huge_vocab", "model=tiny seq_len=64 vocab=99999999999999", "",
       "vocab_size 99999999999999 contradicts param 'embedding.weight' [256, 64], which the "
       "config makes [99999999999999, 64]"},
      // (b) Two blocks in the config, one in the checkpoint.
      {"missing_block", "model=tiny seq_len=64", "layers.1.",
       "num_layers 2 needs param 'layers.1.attn_norm.weight', which the checkpoint does not "
       "have"},
      // (c) small's width (256) beside tiny's tensors (64).
      {"wrong_width", "model=small seq_len=64", "",
       "hidden 256 contradicts param 'embedding.weight' [256, 64], which the config makes "
       "[256, 256]"},
  };
  return *cases;
}

std::string Message(const std::string& dir, const Crafted& c) {
  return absl::StrCat("checkpoint ", dir, ": model config \"", c.model_config, "\": ", c.error);
}

TEST(CheckpointModelTest, ReadsAConsistentCheckpoint) {
  const std::string dir = Scratch("consistent");
  WriteTinyCheckpoint(dir, "model=tiny seq_len=64");
  ASSERT_OK_AND_ASSIGN(const checkpoint::Manifest manifest, checkpoint::ReadManifest(dir));
  ASSERT_OK_AND_ASSIGN(const model::SavedModel saved, CheckpointModel(manifest, dir));
  EXPECT_EQ(saved.preset, "tiny");
}

TEST(CheckpointModelTest, RefusesAConfigItsParamsContradict) {
  for (const Crafted& c : CraftedCases()) {
    const std::string dir = Scratch(c.name);
    WriteTinyCheckpoint(dir, c.model_config, c.drop);
    ASSERT_OK_AND_ASSIGN(const checkpoint::Manifest manifest, checkpoint::ReadManifest(dir));
    EXPECT_THAT(CheckpointModel(manifest, dir),
                StatusIs(absl::StatusCode::kInvalidArgument, Message(dir, c)))
        << c.name;
  }
}

// Runs integration/ckpt with `args`; its exit code, and its stderr in `err`.
int RunCkpt(const std::string& args, std::string* err) {
  const std::string err_file = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt_stderr");
  const int status = std::system(
      absl::StrCat("integration/ckpt ", args, " >/dev/null 2>", err_file).c_str());
  absl::StatusOr<std::string> text = checkpoint::ReadFileToString(err_file);
  *err = text.ok() ? *text : "";
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CheckpointModelTest, CkptForwardAndHfExportReadAConsistentCheckpoint) {
  const std::string dir = Scratch("consistent_cli");
  WriteTinyCheckpoint(dir, "model=tiny seq_len=64");
  std::string err;
  EXPECT_EQ(RunCkpt(absl::StrCat("forward ", dir, " --tokens=1,2,3"), &err), 0) << err;
  EXPECT_EQ(RunCkpt(absl::StrCat("export ", dir, " --to=", dir, "_hf --format=hf"), &err), 0)
      << err;
}

TEST(CheckpointModelTest, CkptForwardAndHfExportRefuseACraftedConfig) {
  for (const Crafted& c : CraftedCases()) {
    const std::string dir = Scratch(c.name);
    WriteTinyCheckpoint(dir, c.model_config, c.drop);
    const std::string line = absl::StrCat("ckpt: ", Message(dir, c), "\n");
    std::string err;
    const std::string logits = dir + "_logits.safetensors";
    EXPECT_EQ(RunCkpt(absl::StrCat("forward ", dir, " --tokens=1,2,3 --out=", logits), &err), 2)
        << c.name;
    EXPECT_EQ(err, line) << c.name;
    ASSERT_OK_AND_ASSIGN(bool wrote_logits, checkpoint::PathExists(logits));
    EXPECT_FALSE(wrote_logits) << c.name;

    const std::string out = dir + "_hf";
    EXPECT_EQ(RunCkpt(absl::StrCat("export ", dir, " --to=", out, " --format=hf"), &err), 2)
        << c.name;
    EXPECT_EQ(err, line) << c.name;
    for (const std::string& path : {out, out + ".export-tmp"}) {
      ASSERT_OK_AND_ASSIGN(bool exists, checkpoint::PathExists(path));
      EXPECT_FALSE(exists) << c.name << ": " << path;
    }
  }
}

}  // namespace
}  // namespace orthoshard::integration
