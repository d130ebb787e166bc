#include "checkpoint/manifest.h"

#include <cstdio>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/shard.h"
#include "checkpoint/testing/test_checkpoint.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::checkpoint::testing::DeterministicBytes;
using ::orthoshard::checkpoint::testing::ScratchDir;
using ::orthoshard::checkpoint::testing::UnvalidatedManifestFile;
using ::orthoshard::checkpoint::testing::SmallModel;
using ::orthoshard::checkpoint::testing::WriteTestCheckpointFiles;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

Manifest OneRecordManifest() {
  Manifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_step(5);
  manifest.set_dp_size(1);
  TensorRecord* record = manifest.add_tensors();
  record->set_name("w");
  record->set_kind(kParamKind);
  record->add_global_shape(2);
  record->add_global_shape(3);
  record->set_dtype("F32");
  record->set_file("rank0.safetensors");
  record->set_file_key("w");
  record->set_offset(64);
  record->set_length(24);
  return manifest;
}

TEST(ManifestTest, RoundTripsThroughTheDirectory) {
  const std::string dir = ScratchDir();
  ASSERT_OK_AND_ASSIGN(Manifest written, WriteTestCheckpointFiles(dir, 12, SmallModel()));
  ASSERT_OK_AND_ASSIGN(Manifest read, ReadManifest(dir));
  EXPECT_EQ(read.SerializeAsString(), written.SerializeAsString());
  EXPECT_EQ(read.step(), 12);
  EXPECT_EQ(read.dp_size(), 2);
  EXPECT_EQ(read.layout_strategy(), "layerwise");
  EXPECT_EQ(read.tensors_size(), 3 * static_cast<int>(SmallModel().size()));
  EXPECT_EQ(read.metadata().at("data_position"), "768");
  EXPECT_THAT(ManifestToText(read), HasSubstr("kind: \"exp_avg_sq\""));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDir(dir));
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.binpb", "rank0.safetensors",
                                             "rank1.safetensors"}));
}

TEST(ManifestTest, RejectsUnknownFormatVersion) {
  const std::string dir = ScratchDir();
  Manifest manifest = OneRecordManifest();
  manifest.set_format_version(7);
  // Written around WriteManifest (which validates) as a future build would write it.
  ASSERT_OK(
      WriteFileAtomically(JoinPath(dir, kManifestFileName), UnvalidatedManifestFile(manifest)));
  EXPECT_THAT(ReadManifest(dir),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(JoinPath(dir, kManifestFileName)),
                             HasSubstr("format version 7 is not supported; this build reads "
                                       "version 1"))));
  EXPECT_THAT(WriteManifest(dir, manifest),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("format version 7")));
}

TEST(ManifestTest, ReportsMissingAndGarbledFiles) {
  const std::string dir = ScratchDir();
  EXPECT_THAT(ReadManifest(dir), StatusIs(absl::StatusCode::kNotFound,
                                          HasSubstr(JoinPath(dir, kManifestFileName))));
  ASSERT_OK(WriteFileAtomically(JoinPath(dir, kManifestFileName), "\xff\xff\xff garbage"));
  EXPECT_THAT(ReadManifest(dir), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("no checksum trailer")));
  // Garbage under a valid trailer: the CRC passes, protobuf refuses it.
  Manifest garbage;
  std::string bytes = UnvalidatedManifestFile(garbage);
  bytes = "\xff\xff\xff garbage" + bytes.substr(bytes.size() - 8);
  const uint32_t crc = Crc32c(bytes.data(), bytes.size() - 8);
  for (int i = 0; i < 4; ++i) bytes[bytes.size() - 8 + i] = static_cast<char>(crc >> (8 * i));
  ASSERT_OK(WriteFileAtomically(JoinPath(dir, kManifestFileName), bytes));
  EXPECT_THAT(ReadManifest(dir), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("not a valid Manifest protobuf")));
}

// Every single-bit flip anywhere in a real manifest file is refused with kDataLoss, before anything
// is parsed: without the CRC trailer protobuf accepted 3,268 of 7,544 such flips (a flipped `step`
// or data position resumed silently elsewhere, a flipped tensor name exported a renamed tensor).
TEST(ManifestTest, EveryBitFlipIsRefused) {
  const std::string dir = ScratchDir();
  ASSERT_OK(WriteTestCheckpointFiles(dir, 12, SmallModel()).status());
  const std::string path = JoinPath(dir, kManifestFileName);
  ASSERT_OK_AND_ASSIGN(const std::string good, ReadFileToString(path));
  ASSERT_OK(ReadManifest(dir).status());
  int refused = 0;
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    const absl::StatusOr<Manifest> decoded = DecodeManifestFile(bad, path);
    EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path))) << "bit " << bit;
    refused += !decoded.ok();
  }
  EXPECT_EQ(refused, static_cast<int>(good.size() * 8));
  std::printf("%d of %zu single-bit flips of a %zu-byte manifest refused\n", refused,
              good.size() * 8, good.size());
  // Truncated anywhere, or missing its trailer: refused too.
  for (size_t keep = 0; keep < good.size(); keep += 7) {
    EXPECT_THAT(DecodeManifestFile(good.substr(0, keep), path),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)))
        << "first " << keep << " bytes";
  }
  EXPECT_THAT(DecodeManifestFile(good.substr(0, good.size() - 8), path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("no checksum trailer")));
}

TEST(ManifestTest, ValidationNamesTheRecord) {
  EXPECT_OK(ValidateManifest(OneRecordManifest(), "m"));
  struct Case {
    const char* label;
    std::function<void(Manifest&)> mutate;
    const char* error;
  };
  std::vector<Case> cases = {
      {"dp", [](Manifest& m) { m.set_dp_size(0); }, "dp_size is 0, expected >= 1"},
      {"length", [](Manifest& m) { m.mutable_tensors(0)->set_length(20); },
       "tensor 'w' (param): length is 20 bytes, shape and dtype F32 need 24"},
      {"dtype", [](Manifest& m) { m.mutable_tensors(0)->set_dtype("F7"); },
       "tensor 'w' (param): unknown safetensors dtype \"F7\""},
      {"file", [](Manifest& m) { m.mutable_tensors(0)->set_file("../x"); },
       "tensor 'w' (param): file \"../x\" is not a plain file name"},
      {"empty", [](Manifest& m) { m.mutable_tensors(0)->set_kind(""); },
       "name, kind and file_key must be non-empty"},
      {"twice", [](Manifest& m) { *m.add_tensors() = m.tensors(0); },
       "tensor 'w' (param): listed twice"},
      {"key",
       [](Manifest& m) {
         TensorRecord copy = m.tensors(0);
         copy.set_kind("exp_avg");
         *m.add_tensors() = copy;
       },
       "tensor 'w' (exp_avg): file_key 'w' of file rank0.safetensors is used by another record"},
  };
  for (const Case& c : cases) {
    Manifest manifest = OneRecordManifest();
    c.mutate(manifest);
    EXPECT_THAT(ValidateManifest(manifest, "m"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.label;
  }
}

TEST(ShardTest, ReadRecordChecksHeaderAndChecksum) {
  const std::string dir = ScratchDir();
  std::vector<uint8_t> w = DeterministicBytes(1, 24), m = DeterministicBytes(2, 24);
  ASSERT_OK_AND_ASSIGN(std::vector<TensorRecord> records,
                       WriteShard(dir, "rank0.safetensors",
                                  {{"w", kParamKind, "F32", {2, 3}, w},
                                   {"w", "momentum", "F32", {2, 3}, m}}));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].file_key(), "w#momentum");
  ASSERT_OK_AND_ASSIGN(SafetensorsReader reader,
                       SafetensorsReader::Open(JoinPath(dir, "rank0.safetensors")));
  std::vector<uint8_t> out(24);
  ASSERT_OK(ReadRecord(reader, records[1], absl::MakeSpan(out)));
  EXPECT_EQ(out, m);

  TensorRecord wrong_crc = records[0];
  wrong_crc.set_crc32c(records[0].crc32c() ^ 1);
  EXPECT_THAT(ReadRecord(reader, wrong_crc, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("rank0.safetensors: tensor 'w' (param): crc32c 0x"),
                             HasSubstr("does not match the manifest's"))));
  TensorRecord wrong_shape = records[0];
  wrong_shape.set_global_shape(0, 3);
  wrong_shape.set_global_shape(1, 2);
  EXPECT_THAT(ReadRecord(reader, wrong_shape, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'w' (param): file has F32 [2,3], manifest says F32 [3,2]")));
  TensorRecord wrong_key = records[0];
  wrong_key.set_file_key("v");
  EXPECT_THAT(ReadRecord(reader, wrong_key, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("no tensor 'v' in the file")));
  EXPECT_THAT(WriteShard(dir, "a/b", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a plain file name")));
}

}  // namespace
}  // namespace orthoshard::checkpoint
