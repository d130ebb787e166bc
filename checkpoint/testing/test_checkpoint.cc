#include "checkpoint/testing/test_checkpoint.h"

#include <cstdlib>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint::testing {

std::string ScratchDir(const std::string& suffix) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string base = tmp != nullptr ? tmp : "/tmp";
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr ? absl::StrCat(info->test_suite_name(), ".", info->name())
                                     : std::string("no_test");
  name = absl::StrReplaceAll(name, {{"/", "_"}});
  std::string dir = JoinPath(base, absl::StrCat(name, suffix));
  EXPECT_TRUE(RemoveRecursively(dir).ok());
  EXPECT_TRUE(MakeDir(dir).ok());
  return dir;
}

std::string UnvalidatedManifestFile(const Manifest& manifest) {
  std::string bytes = manifest.SerializeAsString();
  const uint32_t crc = Crc32c(bytes.data(), bytes.size());
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  return bytes + "OSM1";
}

std::vector<uint8_t> DeterministicBytes(uint64_t seed, size_t count) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(rng() >> 56);
  return bytes;
}

std::vector<TestTensor> SmallModel() {
  return {
      {"embedding.weight", "F32", {32, 8}},
      {"layers.0.attn.qkv.weight", "BF16", {24, 8}},
      {"layers.0.mlp.fc1.weight", "F32", {16, 8}},
      {"layers.0.norm.weight", "F32", {8}},
      {"layers.1.mlp.fc1.weight", "F16", {16, 8}},
      {"final_norm.bias", "F64", {8}},
      {"logit_scale", "F32", {}},
  };
}

std::vector<uint8_t> RecordBytes(const TestTensor& tensor, const std::string& kind, int64_t step) {
  uint64_t size = *TensorByteSize({tensor.name, tensor.dtype, tensor.shape});
  uint64_t seed = std::hash<std::string>()(absl::StrCat(tensor.name, "|", kind, "|", step));
  std::vector<uint8_t> bytes = DeterministicBytes(seed, size);
  if (tensor.dtype == "BOOL") {
    for (uint8_t& b : bytes) b &= 1;  // a bool is stored as 0 or 1
  }
  return bytes;
}

absl::StatusOr<Manifest> WriteTestCheckpointFiles(const std::string& dir, int64_t step,
                                                  const std::vector<TestTensor>& model,
                                                  const TestCheckpointOptions& options) {
  Manifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_step(step);
  manifest.set_layout_strategy("layerwise");
  manifest.set_dp_size(options.dp_size);
  manifest.set_model_config("{\"layers\": 2, \"hidden\": 8}");
  manifest.set_optimizer_config("{\"muon_lr\": 0.02, \"adam_lr\": 0.001}");
  (*manifest.mutable_metadata())["data_position"] = absl::StrCat(step * 64);
  for (int rank = 0; rank < options.dp_size; ++rank) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<RecordData> records;
    for (size_t i = 0; i < model.size(); ++i) {
      if (static_cast<int>(i % options.dp_size) != rank) continue;
      std::vector<std::string> kinds = {kParamKind};
      kinds.insert(kinds.end(), options.optimizer_kinds.begin(), options.optimizer_kinds.end());
      for (const std::string& kind : kinds) {
        storage.push_back(RecordBytes(model[i], kind, step));
      }
    }
    size_t next = 0;
    for (size_t i = 0; i < model.size(); ++i) {
      if (static_cast<int>(i % options.dp_size) != rank) continue;
      std::vector<std::string> kinds = {kParamKind};
      kinds.insert(kinds.end(), options.optimizer_kinds.begin(), options.optimizer_kinds.end());
      for (const std::string& kind : kinds) {
        const std::vector<uint8_t>& bytes = storage[next++];
        records.push_back({model[i].name, kind, model[i].dtype, model[i].shape, bytes});
      }
    }
    ASSIGN_OR_RETURN(std::vector<TensorRecord> written,
                     WriteShard(dir, absl::StrCat("rank", rank, ".safetensors"), records));
    for (TensorRecord& record : written) *manifest.add_tensors() = std::move(record);
  }
  RETURN_IF_ERROR(WriteManifest(dir, manifest));
  return manifest;
}

absl::Status WriteTestCheckpoint(const std::string& root, int64_t step,
                                 const std::vector<TestTensor>& model,
                                 const TestCheckpointOptions& options) {
  ASSIGN_OR_RETURN(std::string dir, BeginCheckpoint(root, step));
  RETURN_IF_ERROR(WriteTestCheckpointFiles(dir, step, model, options).status());
  return CommitCheckpoint(root, step, options.commit);
}

}  // namespace orthoshard::checkpoint::testing
