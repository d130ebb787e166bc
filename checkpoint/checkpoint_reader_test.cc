#include "checkpoint/checkpoint_reader.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
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
using ::orthoshard::checkpoint::testing::UnvalidatedManifestFile;
using ::orthoshard::checkpoint::testing::SmallModel;
using ::orthoshard::checkpoint::testing::TestCheckpointOptions;
using ::orthoshard::checkpoint::testing::TestTensor;
using ::orthoshard::checkpoint::testing::WriteTestCheckpoint;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<uint8_t> Buffer(const TestTensor& t) {
  return std::vector<uint8_t>(*TensorByteSize({t.name, t.dtype, t.shape}));
}

TEST(CheckpointReaderTest, ReadsEveryRecordOnAnyNumberOfShards) {
  for (int dp : {1, 2, 3}) {
    const std::string root = ScratchDir(absl::StrCat("_dp", dp));
    TestCheckpointOptions options;
    options.dp_size = dp;
    options.optimizer_kinds = {"exp_avg", "exp_avg_sq", "main_param"};
    ASSERT_OK(WriteTestCheckpoint(root, 11, SmallModel(), options));
    ASSERT_OK_AND_ASSIGN(CheckpointReader reader, CheckpointReader::Open(root));
    EXPECT_EQ(reader.dir(), JoinPath(root, "step_000011"));
    EXPECT_EQ(reader.manifest().dp_size(), dp);
    for (const TestTensor& t : SmallModel()) {
      EXPECT_EQ(reader.RecordsOf(t.name).size(), 4u);
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq", "main_param"}) {
        std::vector<uint8_t> out = Buffer(t);
        ASSERT_OK(reader.Read(t.name, kind, t.dtype, t.shape, absl::MakeSpan(out)));
        EXPECT_EQ(out, RecordBytes(t, kind, 11)) << t.name << " " << kind;
      }
    }
  }
}

TEST(CheckpointReaderTest, ShapeDtypeAndNameMismatchesNameTheTensor) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 2, SmallModel()));
  ASSERT_OK_AND_ASSIGN(CheckpointReader reader, CheckpointReader::Open(root));
  const std::vector<TestTensor> model = SmallModel();
  const TestTensor& fc1 = model[2];  // layers.0.mlp.fc1.weight, F32 [16,8], rank0
  std::vector<uint8_t> out = Buffer(fc1);
  EXPECT_THAT(reader.Read(fc1.name, "param", "F32", {8, 16}, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank0.safetensors: tensor 'layers.0.mlp.fc1.weight' (param) is "
                                 "F32 [16,8], the model expects F32 [8,16]")));
  EXPECT_THAT(reader.Read(fc1.name, "exp_avg", "BF16", fc1.shape, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("(exp_avg) is F32 [16,8], the model expects BF16 [16,8]")));
  EXPECT_THAT(reader.Read(fc1.name, "momentum", "F32", fc1.shape, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no record 'layers.0.mlp.fc1.weight' (momentum)")));
  EXPECT_EQ(reader.Find("nope", "param"), nullptr);
}

TEST(CheckpointReaderTest, CorruptionIsReportedBeforeOrDuringLoad) {
  const std::string root = ScratchDir();
  ASSERT_OK(WriteTestCheckpoint(root, 2, SmallModel()));
  const std::string dir = JoinPath(root, "step_000002");
  const std::string shard = JoinPath(dir, "rank1.safetensors");
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadFileToString(shard));

  // A flipped bit in a data byte: Open succeeds (headers agree), Read names file and tensor.
  {
    ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir));
    const TensorRecord* norm = nullptr;
    for (const TensorRecord& r : manifest.tensors()) {
      if (r.name() == "layers.0.norm.weight" && r.kind() == "exp_avg") norm = &r;
    }
    ASSERT_NE(norm, nullptr);
    std::string flipped = bytes;
    flipped[norm->offset() + 3] ^= 0x01;
    ASSERT_OK(WriteFileAtomically(shard, flipped));
    ASSERT_OK_AND_ASSIGN(CheckpointReader reader, CheckpointReader::Open(root));
    const std::vector<TestTensor> model = SmallModel();
    const TestTensor& t = model[3];
    std::vector<uint8_t> out = Buffer(t);
    EXPECT_THAT(reader.Read(t.name, "exp_avg", t.dtype, t.shape, absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(shard),
                               HasSubstr("tensor 'layers.0.norm.weight' (exp_avg): crc32c"))));
    EXPECT_OK(reader.Read(t.name, "param", t.dtype, t.shape, absl::MakeSpan(out)));
  }
  // Truncated: Open fails naming the file and a tensor it holds.
  ASSERT_OK(WriteFileAtomically(shard, bytes.substr(0, bytes.size() - 10)));
  EXPECT_THAT(CheckpointReader::Open(root),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(absl::StrCat("checkpoint file ", shard,
                                                    " (holding tensor 'layers.0.attn.qkv.weight' "
                                                    "(param) and 8 more)")),
                             HasSubstr("truncated"))));
  // Missing.
  ASSERT_OK(RemoveRecursively(shard));
  EXPECT_THAT(CheckpointReader::Open(root),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(shard), HasSubstr("No such file or directory"))));
}

TEST(CheckpointReaderTest, UnknownFormatVersionAndMissingPointer) {
  const std::string root = ScratchDir();
  EXPECT_THAT(CheckpointReader::Open(root),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(root + "/latest is missing")));
  ASSERT_OK(WriteTestCheckpoint(root, 2, SmallModel()));
  const std::string dir = JoinPath(root, "step_000002");
  ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir));
  manifest.set_format_version(2);
  ASSERT_OK(
      WriteFileAtomically(JoinPath(dir, kManifestFileName), UnvalidatedManifestFile(manifest)));
  EXPECT_THAT(CheckpointReader::Open(root),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("format version 2 is not supported; this build reads version 1")));
}

}  // namespace
}  // namespace orthoshard::checkpoint
