// Interop: an export written by `ckpt export` is loaded by the Python `safetensors` package
// (safe_open, framework="pt") and must give back the same names, dtypes, shapes and bytes.
//
// The interpreter is tools/python3 (the project-local torch and safetensors that tools/setup
// installs; common/testing/python.h finds it). Without it, or when it cannot import safetensors,
// the test fails saying so: an interop claim is not skipped.

#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/tool/ckpt_commands.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/testing/test_checkpoint.h"
#include "common/testing/python.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::checkpoint::testing::RecordBytes;
using ::orthoshard::checkpoint::testing::ScratchDir;
using ::orthoshard::checkpoint::testing::TestCheckpointOptions;
using ::orthoshard::checkpoint::testing::TestTensor;
using ::orthoshard::checkpoint::testing::WriteTestCheckpoint;

constexpr char kScript[] = "checkpoint/tool/testdata/load_export.py";

// Every dtype of the format, a scalar and an empty tensor.
std::vector<TestTensor> AllDTypeModel() {
  std::vector<TestTensor> model;
  int i = 0;
  for (const std::string& dtype : SafetensorsDTypes()) {
    model.push_back({absl::StrCat("layers.", i, ".", dtype, ".weight"), dtype, {3, 1 + i % 4}});
    ++i;
  }
  model.push_back({"scalar", "F32", {}});
  model.push_back({"empty", "BF16", {0, 4}});
  return model;
}

const std::map<std::string, std::string>& TorchDTypes() {
  static const auto* names = new std::map<std::string, std::string>{
      {"BOOL", "torch.bool"},       {"U8", "torch.uint8"},         {"I8", "torch.int8"},
      {"I16", "torch.int16"},       {"U16", "torch.uint16"},       {"F16", "torch.float16"},
      {"BF16", "torch.bfloat16"},   {"I32", "torch.int32"},        {"U32", "torch.uint32"},
      {"F32", "torch.float32"},     {"F64", "torch.float64"},      {"I64", "torch.int64"},
      {"U64", "torch.uint64"},      {"F8_E4M3", "torch.float8_e4m3fn"},
      {"F8_E5M2", "torch.float8_e5m2"}};
  return *names;
}

class ExportInteropTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(ExportInteropTest, PythonSafetensorsLoadsTheSameTensors) {
  ASSERT_OK_AND_ASSIGN(const std::string python, orthoshard::testing::ProjectPython(kScript));

  const std::string root = ScratchDir();
  const std::vector<TestTensor> model = AllDTypeModel();
  TestCheckpointOptions options;
  options.dp_size = 3;
  ASSERT_OK(WriteTestCheckpoint(root, 9, model, options));
  const std::string out_dir = ScratchDir("_out");
  ExportOptions export_options;
  export_options.max_shard_bytes = GetParam();
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> files,
                       ExportSafetensors(JoinPath(root, "step_000009"), out_dir, export_options));

  const orthoshard::testing::CommandResult run =
      orthoshard::testing::RunPython(python, kScript, {out_dir});
  ASSERT_EQ(run.exit_code, 0) << python << " " << kScript << ": " << run.output;

  std::map<std::string, std::vector<std::string>> loaded;  // name → fields
  for (absl::string_view line : absl::StrSplit(run.output, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    if (fields[0] == "tensor") {
      ASSERT_EQ(fields.size(), 6u) << line;
      loaded[fields[1]] = fields;
    }
  }
  ASSERT_EQ(loaded.size(), model.size()) << run.output;
  for (const TestTensor& tensor : model) {
    auto it = loaded.find(tensor.name);
    ASSERT_NE(it, loaded.end()) << tensor.name;
    const std::vector<std::string>& fields = it->second;
    EXPECT_EQ(fields[2], TorchDTypes().at(tensor.dtype)) << tensor.name;
    EXPECT_EQ(fields[3], absl::StrCat("[", absl::StrJoin(tensor.shape, ","), "]")) << tensor.name;
    std::vector<uint8_t> expected = RecordBytes(tensor, kParamKind, 9);
    EXPECT_EQ(fields[5], absl::BytesToHexString(absl::string_view(
                             reinterpret_cast<const char*>(expected.data()), expected.size())))
        << tensor.name;
  }
  if (files.size() > 1) {
    EXPECT_THAT(run.output, ::testing::HasSubstr("total_size\t"));
  }
}

// One file, and shards of at most 64 bytes (many shards plus the index).
INSTANTIATE_TEST_SUITE_P(ShardLimits, ExportInteropTest,
                         ::testing::Values(kDefaultMaxShardBytes, uint64_t{64}));

}  // namespace
}  // namespace orthoshard::checkpoint
