#include "checkpoint/safetensors.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/testing/test_checkpoint.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::checkpoint::testing::DeterministicBytes;
using ::orthoshard::checkpoint::testing::ScratchDir;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Writes `bytes` to `path` without fsync (scratch files only).
void WriteScratch(const std::string& path, const std::string& bytes) {
  ASSERT_OK_AND_ASSIGN(File file, File::CreateForWrite(path));
  ASSERT_OK(file.WriteAll(bytes.data(), bytes.size()));
  ASSERT_OK(file.Close());
}

// Writes `header` (length-prefixed, unpadded) followed by `data_size` zero bytes to `path`.
void WriteRawFile(const std::string& path, const std::string& header, size_t data_size) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  bytes += header;
  bytes.append(data_size, '\0');
  WriteScratch(path, bytes);
}

TEST(SafetensorsTest, RoundTripsEveryDType) {
  const std::string dir = ScratchDir();
  const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {}, {0, 4}, {2, 1, 3}};
  for (const std::string& dtype : SafetensorsDTypes()) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<TensorData> tensors;
    for (size_t s = 0; s < shapes.size(); ++s) {
      TensorSpec spec{absl::StrCat("t", s, ".", dtype), dtype, shapes[s]};
      ASSERT_OK_AND_ASSIGN(uint64_t size, TensorByteSize(spec));
      storage.push_back(DeterministicBytes(s * 100 + dtype.size(), size));
      tensors.push_back({spec, storage.back()});
    }
    const std::string path = JoinPath(dir, dtype + ".safetensors");
    ASSERT_OK_AND_ASSIGN(std::vector<WrittenTensor> written,
                         WriteSafetensorsFile(path, tensors, {{"format", "pt"}, {"k", "v\"q"}}));
    ASSERT_OK_AND_ASSIGN(SafetensorsReader reader, SafetensorsReader::Open(path));
    EXPECT_EQ(reader.data_start() % 8, 0u) << dtype;
    EXPECT_EQ(reader.header().metadata,
              (std::vector<std::pair<std::string, std::string>>{{"format", "pt"}, {"k", "v\"q"}}));
    ASSERT_EQ(reader.header().tensors.size(), shapes.size());
    for (size_t s = 0; s < shapes.size(); ++s) {
      const TensorEntry* entry = reader.Find(tensors[s].spec.name);
      ASSERT_NE(entry, nullptr);
      EXPECT_EQ(entry->spec.dtype, dtype);
      EXPECT_EQ(entry->spec.shape, shapes[s]);
      EXPECT_EQ(written[s].offset, reader.data_start() + entry->begin);
      EXPECT_EQ(written[s].length, storage[s].size());
      EXPECT_EQ(written[s].crc32c, Crc32c(storage[s].data(), storage[s].size()));
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, reader.ReadTensor(tensors[s].spec.name));
      EXPECT_EQ(bytes, storage[s]) << tensors[s].spec.name;
    }
  }
}

TEST(SafetensorsTest, StreamingWriterAcceptsChunksAcrossTensors) {
  const std::string path = JoinPath(ScratchDir(), "s.safetensors");
  std::vector<TensorSpec> specs = {{"a", "F32", {4}}, {"empty", "F16", {0}}, {"b", "U8", {5}},
                                   {"tail", "I64", {0, 2}}};
  ASSERT_OK_AND_ASSIGN(SafetensorsWriter writer, SafetensorsWriter::Create(path, specs));
  std::vector<uint8_t> data = DeterministicBytes(7, 21);
  ASSERT_OK(writer.Append(absl::MakeConstSpan(data).subspan(0, 3)));
  ASSERT_OK(writer.Append(absl::MakeConstSpan(data).subspan(3, 15)));
  ASSERT_OK(writer.Append(absl::MakeConstSpan(data).subspan(18, 3)));
  ASSERT_OK_AND_ASSIGN(std::vector<WrittenTensor> written, writer.Finish());
  ASSERT_EQ(written.size(), 4u);
  EXPECT_EQ(written[0].crc32c, Crc32c(data.data(), 16));
  EXPECT_EQ(written[2].crc32c, Crc32c(data.data() + 16, 5));
  ASSERT_OK_AND_ASSIGN(SafetensorsReader reader, SafetensorsReader::Open(path));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> b, reader.ReadTensor("b"));
  EXPECT_EQ(b, std::vector<uint8_t>(data.begin() + 16, data.end()));
}

TEST(SafetensorsTest, WriterRejectsMisuse) {
  const std::string dir = ScratchDir();
  EXPECT_THAT(SafetensorsWriter::Create(JoinPath(dir, "x"), {{"w", "F32", {1}}, {"w", "F32", {1}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate tensor name 'w'")));
  EXPECT_THAT(SafetensorsWriter::Create(JoinPath(dir, "x"), {{"w", "F128", {1}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown safetensors dtype")));
  EXPECT_THAT(SafetensorsWriter::Create(JoinPath(dir, "x"), {{"__metadata__", "F32", {1}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
  EXPECT_THAT(SafetensorsWriter::Create(JoinPath(dir, "no/such/dir/x"), {{"w", "F32", {1}}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir/x")));
  {
    ASSERT_OK_AND_ASSIGN(SafetensorsWriter writer,
                         SafetensorsWriter::Create(JoinPath(dir, "short"), {{"w", "F32", {2}}}));
    std::vector<uint8_t> four(4);
    ASSERT_OK(writer.Append(four));
    EXPECT_THAT(writer.Finish(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("tensor 'w' has 4 of its 8 bytes")));
  }
  {
    ASSERT_OK_AND_ASSIGN(SafetensorsWriter writer,
                         SafetensorsWriter::Create(JoinPath(dir, "long"), {{"w", "F32", {1}}}));
    std::vector<uint8_t> six(6);
    EXPECT_THAT(writer.Append(six), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("2 bytes appended after the last tensor")));
  }
  std::vector<uint8_t> three(3);
  EXPECT_THAT(WriteSafetensorsFile(JoinPath(dir, "m"), {{{"w", "F32", {1}}, three}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'w' has shape [1] of F32 (4 bytes) but 3 bytes")));
}

TEST(SafetensorsTest, ReadsTensorsByNameWithoutLoadingTheFile) {
  const std::string path = JoinPath(ScratchDir(), "r.safetensors");
  std::vector<uint8_t> a = DeterministicBytes(1, 64), b = DeterministicBytes(2, 8);
  ASSERT_OK(WriteSafetensorsFile(path, {{{"a", "F64", {8}}, a}, {{"b", "I32", {2}}, b}}).status());
  ASSERT_OK_AND_ASSIGN(SafetensorsReader reader, SafetensorsReader::Open(path));
  std::vector<uint8_t> out(8);
  ASSERT_OK(reader.ReadTensor("b", absl::MakeSpan(out)));
  EXPECT_EQ(out, b);
  EXPECT_THAT(reader.ReadTensor("zz"),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr(path), HasSubstr("'zz'"))));
  std::vector<uint8_t> wrong(7);
  EXPECT_THAT(reader.ReadTensor("b", absl::MakeSpan(wrong)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 8 bytes, the buffer 7")));
  EXPECT_THAT(reader.ReadBytes(reader.data_start() + 70, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("past its end")));
}

struct MalformedCase {
  const char* label;
  std::string header;
  size_t data_size;
  const char* error;
};

TEST(SafetensorsTest, RejectsEachClassOfMalformedFileNamingFileAndTensor) {
  const std::string dir = ScratchDir();
  const std::vector<MalformedCase> cases = {
      {"unknown_dtype", R"({"w":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8,
       "tensor 'w': unknown dtype \"F128\""},
      {"size_mismatch", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20,
       "tensor 'w': shape [2,3] of F32 needs 24 bytes, data_offsets [0,20] give 20"},
      {"out_of_range", R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", 16,
       "tensor 'w': truncated: data_offsets [0,24] run past the 16 data bytes"},
      {"overlap",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
       6, "tensor 'b': data_offsets [2,6] overlap the previous tensor, which ends at 4"},
      {"gap",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
       10, "tensor 'b': data_offsets [6,10] leave a gap after byte 4"},
      {"gap_at_start", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[1,5]}})", 5,
       "tensor 'a': data_offsets [1,5] leave a gap after byte 0"},
      {"trailing", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 9,
       "trailing bytes: tensors cover 4 data bytes, the file has 9"},
      {"duplicate",
       R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, "duplicate key \"w\""},
      {"reversed", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4,
       "tensor 'w': data_offsets [4,0] end before they begin"},
      {"negative_dim", R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0,
       "tensor 'w': shape must be an array of non-negative integers"},
      {"huge_shape",
       R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
       "tensor 'w': shape [4294967296,4294967296] of F64 has more than 2^64 bytes"},
      {"missing_field", R"({"w":{"dtype":"U8","shape":[1]}})", 1,
       "tensor 'w': entry needs \"dtype\", \"shape\" and \"data_offsets\""},
      {"extra_field", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1,
       "tensor 'w': unexpected field \"x\""},
      {"entry_not_object", R"({"w":[1]})", 0, "tensor 'w': entry is a array, expected an object"},
      {"bad_json", R"({"w":{"dtype":"U8",})", 0, "header: JSON error at byte"},
      {"not_object", R"([1,2])", 0, "header is a JSON array, expected an object"},
      {"metadata_value", R"({"__metadata__":{"k":1}})", 0,
       "\"__metadata__\" value of \"k\" is a integer, expected a string"},
      {"float_offsets", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})", 1,
       "only integers"},
  };
  for (const MalformedCase& c : cases) {
    const std::string path = JoinPath(dir, absl::StrCat(c.label, ".safetensors"));
    WriteRawFile(path, c.header, c.data_size);
    EXPECT_THAT(SafetensorsReader::Open(path),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("safetensors file ", path, ": ")),
                               HasSubstr(c.error))))
        << c.label;
  }
}

TEST(SafetensorsTest, RejectsTruncatedAndOversizedHeaders) {
  const std::string dir = ScratchDir();
  const std::string tiny = JoinPath(dir, "tiny");
  ASSERT_OK(WriteFileAtomically(tiny, "abc"));
  EXPECT_THAT(SafetensorsReader::Open(tiny),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: 3 bytes, too short for the 8-byte header length")));

  const std::string huge = JoinPath(dir, "huge");
  std::string bytes(8, '\0');
  uint64_t n = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  ASSERT_OK(WriteFileAtomically(huge, bytes + "{}"));
  EXPECT_THAT(SafetensorsReader::Open(huge),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(huge), HasSubstr("header length 100000001 exceeds the limit "
                                                        "of 100000000 bytes"))));

  // A valid file cut in the middle of its data, and in the middle of its header.
  const std::string good = JoinPath(dir, "good");
  std::vector<uint8_t> data = DeterministicBytes(3, 40);
  ASSERT_OK(WriteSafetensorsFile(good, {{{"w", "F32", {10}}, data}}).status());
  ASSERT_OK_AND_ASSIGN(std::string whole, ReadFileToString(good));
  const std::string cut_data = JoinPath(dir, "cut_data");
  ASSERT_OK(WriteFileAtomically(cut_data, whole.substr(0, whole.size() - 1)));
  EXPECT_THAT(SafetensorsReader::Open(cut_data),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'w': truncated: data_offsets [0,40] run past the 39")));
  const std::string cut_header = JoinPath(dir, "cut_header");
  ASSERT_OK(WriteFileAtomically(cut_header, whole.substr(0, 20)));
  EXPECT_THAT(SafetensorsReader::Open(cut_header),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated: header length")));
  EXPECT_THAT(SafetensorsReader::Open(JoinPath(dir, "missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
}

// A valid header is mutated thousands of times (seeded); every result must be a clean Status, and
// every header that still parses must satisfy the format's invariants.
TEST(SafetensorsTest, RandomlyMutatedHeadersNeverCrash) {
  std::vector<TensorSpec> specs = {{"embedding.weight", "F32", {4, 3}},
                                   {"layers.0.w", "BF16", {2, 2}},
                                   {"scalar", "I64", {}},
                                   {"flag\\u00e9", "BOOL", {5}}};
  ASSERT_OK_AND_ASSIGN(std::string header,
                       SerializeSafetensorsHeader(specs, {{"format", "pt"}, {"note", "a\"b"}}));
  uint64_t data_size = 48 + 8 + 8 + 5;
  ASSERT_OK(ParseSafetensorsHeader(header, data_size, "base").status());
  const std::string alphabet = "{}[]\",:0123456789-\\u eE.tfn";
  std::mt19937_64 rng(20261122);
  int rejected = 0;
  int accepted = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::string text = header;
    int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !text.empty(); ++m) {
      size_t pos = rng() % text.size();
      switch (rng() % 6) {
        case 0: text[pos] = static_cast<char>(rng() & 0xFF); break;
        case 1: text[pos] = alphabet[rng() % alphabet.size()]; break;
        case 2: text.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
        case 3: text.erase(pos, 1 + rng() % 8); break;
        case 4: text.resize(pos); break;
        case 5: {
          size_t len = std::min<size_t>(1 + rng() % 40, text.size() - pos);
          text.insert(rng() % text.size(), text.substr(pos, len));
          break;
        }
      }
    }
    uint64_t size = (rng() % 8 == 0) ? rng() % 200 : data_size;
    absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensorsHeader(text, size, "mutant");
    if (!parsed.ok()) {
      ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
      ASSERT_THAT(std::string(parsed.status().message()), HasSubstr("safetensors file mutant: "));
      ++rejected;
      continue;
    }
    ++accepted;
    uint64_t cursor = 0;
    for (const TensorEntry& entry : parsed->tensors) {
      ASSERT_EQ(entry.begin, cursor) << text;
      ASSERT_OK_AND_ASSIGN(uint64_t bytes, TensorByteSize(entry.spec));
      ASSERT_EQ(entry.end - entry.begin, bytes) << text;
      cursor = entry.end;
    }
    ASSERT_EQ(cursor, size) << text;
  }
  EXPECT_GT(rejected, 15000);
  std::cout << "mutants rejected " << rejected << ", accepted " << accepted << "\n";
}

// The same through files: mutations of the length prefix and of the header bytes on disk.
TEST(SafetensorsTest, RandomlyMutatedFilesNeverCrash) {
  const std::string dir = ScratchDir();
  const std::string good = JoinPath(dir, "good");
  std::vector<uint8_t> data = DeterministicBytes(5, 24);
  ASSERT_OK(WriteSafetensorsFile(good, {{{"a", "F32", {2, 2}}, absl::MakeConstSpan(data).first(16)},
                                        {{"b", "U8", {8}}, absl::MakeConstSpan(data).subspan(16)}})
                .status());
  ASSERT_OK_AND_ASSIGN(std::string whole, ReadFileToString(good));
  std::mt19937_64 rng(7);
  const std::string path = JoinPath(dir, "mutant");
  int errors = 0;
  for (int iteration = 0; iteration < 500; ++iteration) {
    std::string bytes = whole;
    size_t limit = std::min<size_t>(bytes.size(), 8 + 80);
    for (int m = 0; m < 1 + static_cast<int>(rng() % 3); ++m) {
      bytes[rng() % limit] = static_cast<char>(rng() & 0xFF);
    }
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    WriteScratch(path, bytes);
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    if (!reader.ok()) {
      ASSERT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
      ASSERT_THAT(std::string(reader.status().message()), HasSubstr(path));
      ++errors;
      continue;
    }
    for (const TensorEntry& entry : reader->header().tensors) {
      ASSERT_OK(reader->ReadTensor(entry.spec.name).status());
    }
  }
  EXPECT_GT(errors, 250);
}

}  // namespace
}  // namespace orthoshard::checkpoint
