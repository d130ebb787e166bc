#include "data/data_spec.h"
#include "data/dataset.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "data/testing/dataset_files.h"

namespace orthoshard::data {
namespace {

using ::orthoshard::data::testing::MegatronIdx;
using ::orthoshard::data::testing::Put;
using ::orthoshard::data::testing::Ramp;
using ::orthoshard::data::testing::ReadFile;
using ::orthoshard::data::testing::RecordPreparedChecks;
using ::orthoshard::data::testing::TempPath;
using ::orthoshard::data::testing::WriteFile;
using ::orthoshard::data::testing::WritePrepared;
using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;


TEST(SyntheticCorpus, DeterministicAndLearnable) {
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus a, MakeSyntheticCorpus({/*seed=*/5, /*num_tokens=*/200000}));
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus b, MakeSyntheticCorpus({/*seed=*/5, /*num_tokens=*/200000}));
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus c, MakeSyntheticCorpus({/*seed=*/6, /*num_tokens=*/200000}));
  EXPECT_EQ(a.data.tokens.ToVector(), b.data.tokens.ToVector());
  EXPECT_NE(a.data.tokens.ToVector(), c.data.tokens.ToVector());
  ASSERT_EQ(a.data.tokens.size(), 200000);
  const std::vector<int32_t> all = a.data.tokens.ToVector();
  EXPECT_EQ(a.data.max_token, *std::max_element(all.begin(), all.end()));
  EXPECT_EQ(a.data.vocab_size, 256);
  // Far below the unigram entropy: a model has much to learn beyond byte frequencies. These are
  // properties of the generator (integer counts, sums of logs in double), not tolerances:
  // measured 3.2458 and 0.3364 nats, at least 0.06 from every bound; their roundoff (sums of
  // < 10^5 double terms) is below 1e-10.
  EXPECT_GT(a.unigram_entropy_nats, 2.5);
  EXPECT_LT(a.entropy_nats_per_token, 0.4);
  EXPECT_GT(a.entropy_nats_per_token, 0.2);
  EXPECT_EQ(a.unigram_entropy_nats, UnigramEntropy(a.data.tokens));  // same code, same input
  // Each line opens and closes with the same name.
  const std::vector<int32_t> ids = a.data.tokens.ToVector();
  const std::string text(ids.begin(), ids.begin() + 2000);
  const size_t end = text.find('\n');
  ASSERT_NE(end, std::string::npos);
  const std::string line = text.substr(0, end);
  const std::string name = line.substr(0, line.find(' '));
  EXPECT_EQ(line.substr(line.size() - name.size() - 3), ", " + name + ".");
}

TEST(SyntheticCorpus, RejectsTinySize) {
  EXPECT_THAT(MakeSyntheticCorpus({1, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("synthetic corpus: num_tokens must be >= 64, got 10")));
}

TEST(UnigramEntropy, UniformIsLogN) {
  // Four terms -(1/4) log(1/4): log within 1 ulp on each side (2 * 2^-52 relative), the scaling
  // by 1/4 exact, two of the three additions rounded (2 * 2^-53): at most 6 * 2^-53 relative.
  EXPECT_NEAR(UnigramEntropy(TokenStream({0, 1, 2, 3})), std::log(4.0),
              8 * 0x1p-53 * std::log(4.0));
  EXPECT_EQ(UnigramEntropy(TokenStream({7, 7, 7})), 0.0);
  EXPECT_EQ(UnigramEntropy(TokenStream()), 0.0);
}

TEST(TextFile, BytesAreTokens) {
  const std::string path = TempPath("text.txt");
  WriteFile(path, std::string("hi\xff\n", 4));
  ASSERT_OK_AND_ASSIGN(TokenDataset data, LoadTextFile(path));
  EXPECT_EQ(data.vocab_size, 256);
  EXPECT_TRUE(data.tokens.mapped());
  EXPECT_THAT(data.tokens.ToVector(), ElementsAre('h', 'i', 255, '\n'));
  EXPECT_EQ(data.max_token, 255);
  WriteFile(path, "");
  EXPECT_THAT(LoadTextFile(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("data file '" + path + "': file is empty")));
  EXPECT_THAT(LoadTextFile(TempPath("absent.txt")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("data file '" + TempPath("absent.txt") +
                                 "': cannot open: No such file or directory")));
}

TEST(NanoGptFile, Uint16LittleEndian) {
  const std::string path = TempPath("train.bin");
  WriteFile(path, std::string("\x01\x00\xff\x00\x00\x01", 6));
  ASSERT_OK_AND_ASSIGN(TokenDataset data, LoadNanoGptFile(path));
  EXPECT_THAT(data.tokens.ToVector(), ElementsAre(1, 255, 256));
  EXPECT_EQ(data.vocab_size, 0);  // the format does not record it
  EXPECT_EQ(data.max_token, 256);
  WriteFile(path, std::string("\x01\x00\x02", 3));
  EXPECT_THAT(LoadNanoGptFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("size 3 bytes is not a multiple of 2 (uint16 tokens)")));
  EXPECT_THAT(LoadNanoGptFile(TempPath("absent.bin")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

TEST(Megatron, ReadsSequencesInOrder) {
  const std::string prefix = TempPath("mega");
  // Two documents: sequences {0, 1} and {2}; int32 tokens.
  WriteFile(prefix + ".idx", MegatronIdx(4, 4, {2, 1, 3}, {0, 2, 3}));
  std::string bin;
  for (int32_t t : {10, 11, 20, 30, 31, 32}) Put<int32_t>(&bin, t);
  WriteFile(prefix + ".bin", bin);
  ASSERT_OK_AND_ASSIGN(TokenDataset data, LoadMegatronDataset(prefix));
  EXPECT_THAT(data.tokens.ToVector(), ElementsAre(10, 11, 20, 30, 31, 32));
  EXPECT_EQ(data.max_token, 32);
  EXPECT_EQ(data.eod_token, -1);

  ASSERT_OK_AND_ASSIGN(MegatronIndex index,
                       ParseMegatronIndex(MegatronIdx(4, 4, {2, 1, 3}, {0, 2, 3}), "x"));
  EXPECT_EQ(index.dtype_code, 4);
  EXPECT_THAT(index.lengths, ElementsAre(2, 1, 3));
  EXPECT_THAT(index.pointers, ElementsAre(0, 8, 12));
  EXPECT_THAT(index.document_index, ElementsAre(0, 2, 3));
  EXPECT_EQ(index.bin_bytes(), 24);
}

TEST(Megatron, Uint16AndUint8) {
  const std::string prefix = TempPath("mega16");
  WriteFile(prefix + ".idx", MegatronIdx(8, 2, {3}, {0, 1}));
  WriteFile(prefix + ".bin", std::string("\x05\x00\x00\x01\x07\x00", 6));
  ASSERT_OK_AND_ASSIGN(TokenDataset data, LoadMegatronDataset(prefix));
  EXPECT_THAT(data.tokens.ToVector(), ElementsAre(5, 256, 7));
  WriteFile(prefix + ".idx", MegatronIdx(1, 1, {2, 1}, {0, 2}));
  WriteFile(prefix + ".bin", "abc");
  ASSERT_OK_AND_ASSIGN(data, LoadMegatronDataset(prefix));
  EXPECT_THAT(data.tokens.ToVector(), ElementsAre('a', 'b', 'c'));
}

TEST(Megatron, LoadErrors) {
  const std::string prefix = TempPath("megabad");
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  EXPECT_THAT(LoadMegatronDataset(prefix),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("megatron index '" + idx + "': cannot open")));
  WriteFile(idx, MegatronIdx(3, 2, {2}, {0, 1}));
  EXPECT_THAT(LoadMegatronDataset(prefix),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("megatron data '" + bin + "'")));
  WriteFile(bin, std::string("\x01\x00", 2));
  EXPECT_THAT(LoadMegatronDataset(prefix),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("megatron data '" + bin + "': size 2 bytes, index '" + idx +
                                 "' says 4")));
  WriteFile(bin, std::string("\x01\x00\xff\xff", 4));  // int16 -1
  EXPECT_THAT(LoadMegatronDataset(prefix),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("token -1 at index 1 is negative")));
  WriteFile(idx, MegatronIdx(7, 4, {1}, {0, 1}));
  EXPECT_THAT(LoadMegatronDataset(prefix),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dtype code 7 (float32) is not an integer token type")));
}

TEST(Megatron, ParseErrors) {
  const std::string good = MegatronIdx(4, 4, {2, 1}, {0, 2});
  auto parse = [](const std::string& bytes) { return ParseMegatronIndex(bytes, "d.idx"); };
  EXPECT_THAT(parse(good.substr(0, 20)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("megatron index 'd.idx': truncated header: 20 bytes, expected "
                                 "at least 34")));
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_THAT(parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("megatron index 'd.idx': bad magic, expected "
                                             "\"MMIDIDX\\0\\0\"")));
  bad = good;
  bad[9] = 2;
  EXPECT_THAT(parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("unsupported version 2, expected 1")));
  bad = good;
  bad[17] = 9;
  EXPECT_THAT(parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("unknown dtype code 9, expected 1..8")));
  EXPECT_THAT(parse(good.substr(0, good.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("truncated: 2 sequences and 2 documents need 34 + 12 * 2 + 8 * 2 "
                                 "bytes, file has 73")));
  EXPECT_THAT(parse(good + "zz"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 trailing bytes after the document index")));
  bad = good;
  const int32_t negative = -3;
  std::memcpy(&bad[34 + 4], &negative, 4);
  EXPECT_THAT(parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("sequence 1 has negative length -3")));
  bad = good;
  const int64_t pointer = 12;
  std::memcpy(&bad[34 + 8 + 8], &pointer, 8);
  EXPECT_THAT(parse(bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sequence 1 starts at byte 12, expected 8 (pointers must be "
                                 "contiguous: previous pointer + length * 4)")));
  EXPECT_THAT(parse(MegatronIdx(4, 4, {2, 1}, {0, 3})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("document index entry 1 is 3, expected non-decreasing values "
                                 "from 0 to the sequence count 2")));
  EXPECT_THAT(parse(MegatronIdx(4, 4, {2, 1}, {0, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("document index ends at 1, expected the sequence count 2")));
  EXPECT_THAT(parse(MegatronIdx(4, 4, {2, 1}, {})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("document count is 0")));
  // A sequence count that would overflow a naive size computation.
  bad = good;
  const uint64_t huge = 0x2000000000000001ull;
  std::memcpy(&bad[18], &huge, 8);
  EXPECT_THAT(parse(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated: ")));
}

// Seeded random mutations of a valid index: the parser returns OK or an error, never crashes, and
// whatever it accepts is self-consistent.
TEST(Megatron, MutatedIndexNeverCrashes) {
  const std::string good = MegatronIdx(8, 2, {5, 0, 7, 3}, {0, 1, 3, 4});
  std::mt19937_64 rng(99);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0: bytes[rng() % bytes.size()] = static_cast<char>(rng()); break;
        case 1: bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8)); break;
        case 2: bytes.resize(rng() % (bytes.size() + 1)); break;
        case 3: bytes.insert(rng() % (bytes.size() + 1), 1, static_cast<char>(rng())); break;
      }
      if (bytes.empty()) bytes = "M";
    }
    absl::StatusOr<MegatronIndex> index = ParseMegatronIndex(bytes, "m.idx");
    if (!index.ok()) {
      EXPECT_THAT(std::string(index.status().message()), HasSubstr("megatron index 'm.idx': "));
      continue;
    }
    ++accepted;
    ASSERT_EQ(index->lengths.size(), index->pointers.size());
    ASSERT_EQ(index->document_index.front(), 0);
    ASSERT_EQ(index->document_index.back(), static_cast<int64_t>(index->lengths.size()));
    ASSERT_GE(index->bin_bytes(), 0);
  }
  EXPECT_GT(accepted, 0);  // some mutations (e.g. a dtype code change) stay valid
}

TEST(LoadDatasetSpec, EveryKind) {
  ASSERT_OK_AND_ASSIGN(TokenDataset synthetic, LoadDatasetSpec("synthetic:1000", 3));
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus direct, MakeSyntheticCorpus({3, 1000}));
  EXPECT_EQ(synthetic.tokens.ToVector(), direct.data.tokens.ToVector());
  ASSERT_OK_AND_ASSIGN(TokenDataset default_size, LoadDatasetSpec("synthetic", 3));
  EXPECT_EQ(default_size.tokens.size(), 1 << 20);

  const std::string text = TempPath("spec.txt");
  WriteFile(text, "abc");
  ASSERT_OK_AND_ASSIGN(TokenDataset t, LoadDatasetSpec("text:" + text, 0));
  EXPECT_THAT(t.tokens.ToVector(), ElementsAre('a', 'b', 'c'));
  const std::string nano = TempPath("spec.bin");
  WriteFile(nano, std::string("\x02\x00", 2));
  ASSERT_OK_AND_ASSIGN(TokenDataset n, LoadDatasetSpec("nanogpt:" + nano, 0));
  EXPECT_THAT(n.tokens.ToVector(), ElementsAre(2));
  const std::string prefix = TempPath("spec_mega");
  WriteFile(prefix + ".idx", MegatronIdx(1, 1, {2}, {0, 1}));
  WriteFile(prefix + ".bin", std::string("\x01\x04", 2));
  ASSERT_OK_AND_ASSIGN(TokenDataset m, LoadDatasetSpec("megatron:" + prefix, 0));
  EXPECT_THAT(m.tokens.ToVector(), ElementsAre(1, 4));

  for (const char* spec : {"csv:x", "text", "text:", "synthetic:many", ""}) {
    EXPECT_THAT(LoadDatasetSpec(spec, 0),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("data spec '", spec,
                                                "': expected synthetic[:TOKENS], text:PATH, "
                                                "nanogpt:PATH, megatron:PREFIX or "
                                                "prepared:DIR"))));
  }
  EXPECT_THAT(LoadDatasetSpec("nanogpt:" + TempPath("none.bin"), 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

// A spec is parsed once into its kind; every kind's name parses back to it, and a bad spec is
// refused with LoadDatasetSpec's message.
TEST(ParseDataSpec, EveryKindAndItsArgument) {
  for (DataKind kind : {DataKind::kSynthetic, DataKind::kText, DataKind::kNanoGpt,
                        DataKind::kMegatron, DataKind::kPrepared}) {
    const std::string spec = absl::StrCat(DataKindName(kind), ":5000");
    ASSERT_OK_AND_ASSIGN(const DataSpec parsed, ParseDataSpec(spec));
    EXPECT_EQ(parsed.kind, kind) << spec;
    if (kind == DataKind::kSynthetic) {
      EXPECT_EQ(parsed.synthetic_tokens, 5000);
      EXPECT_EQ(parsed.path, "");
    } else {
      EXPECT_EQ(parsed.path, "5000") << spec;
      EXPECT_EQ(parsed.synthetic_tokens, std::nullopt) << spec;
    }
  }
  ASSERT_OK_AND_ASSIGN(const DataSpec bare, ParseDataSpec("synthetic"));
  EXPECT_EQ(bare.synthetic_tokens, std::nullopt);
  ASSERT_OK_AND_ASSIGN(const DataSpec colon_path, ParseDataSpec("prepared:/a:b"));
  EXPECT_EQ(colon_path.path, "/a:b");  // only the first colon separates
  for (const char* spec : {"Text:x", "prepared", "prepared:", "synthetic:", "synthetic:1e6"}) {
    EXPECT_THAT(ParseDataSpec(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("data spec '", spec, "': expected"))));
  }
}

TEST(SplitTrainEval, DocumentEndsFollowTheParts) {
  TokenDataset data{"d", 10, -1, TokenStream({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), 9};
  data.document_ends = {2, 5, 7, 10};
  ASSERT_OK_AND_ASSIGN(auto parts, SplitTrainEval(data, 0.25, 2));  // 7 + 3 tokens
  EXPECT_THAT(parts.first.document_ends, ElementsAre(2, 5, 7));
  EXPECT_THAT(parts.second.document_ends, ElementsAre(3));
  ASSERT_OK_AND_ASSIGN(parts, SplitTrainEval(data, 0.35, 2));  // 6 + 4: a document is cut
  EXPECT_THAT(parts.first.document_ends, ElementsAre(2, 5, 6));
  EXPECT_THAT(parts.second.document_ends, ElementsAre(1, 4));
}

TEST(SplitTrainEval, TailIsHeldOut) {
  TokenDataset data{"d", 10, -1, TokenStream({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), 9};
  ASSERT_OK_AND_ASSIGN(auto parts, SplitTrainEval(data, 0.25, 2));
  EXPECT_THAT(parts.first.tokens.ToVector(), ElementsAre(0, 1, 2, 3, 4, 5, 6));
  EXPECT_THAT(parts.second.tokens.ToVector(), ElementsAre(7, 8, 9));
  EXPECT_EQ(parts.second.tokens[0], 7);
  EXPECT_EQ(parts.second.tokens.Slice(1, 2).ToVector(), std::vector<int32_t>({8, 9}));
  EXPECT_EQ(parts.second.vocab_size, 10);
  EXPECT_THAT(SplitTrainEval(data, 1.5, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("eval fraction must be in (0, 1), got 1.5")));
  EXPECT_THAT(SplitTrainEval(data, 0.05, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dataset 'd' has 10 tokens: an eval fraction of 0.05 leaves 9 "
                                 "train and 1 eval tokens, each needs at least 2")));
}

TEST(Prepared, VocabularyEodAndValSplitComeFromTheDirectory) {
  const std::string dir = TempPath("prepared");
  WritePrepared(dir, 300, 299, Ramp(200, 300), Ramp(80, 300));
  ASSERT_OK_AND_ASSIGN(TokenDataset data, LoadDatasetSpec("prepared:" + dir, 0));
  EXPECT_EQ(data.vocab_size, 300);
  EXPECT_EQ(data.eod_token, 299);
  EXPECT_EQ(data.tokens.size(), 200);
  EXPECT_TRUE(data.tokens.mapped());
  ASSERT_OK_AND_ASSIGN(std::optional<TokenDataset> eval, LoadEvalSplitOf("prepared:" + dir));
  ASSERT_TRUE(eval.has_value());
  EXPECT_EQ(eval->name, dir + "/val");
  EXPECT_EQ(eval->tokens.size(), 80);
  EXPECT_EQ(eval->eod_token, 299);
  ASSERT_OK_AND_ASSIGN(std::optional<TokenDataset> none,
                       LoadEvalSplitOf("megatron:" + dir + "/train"));
  EXPECT_FALSE(none.has_value());
}

TEST(Prepared, FilesAreCheckedAgainstDatasetJson) {
  const std::string dir = TempPath("prepared_checked");
  WritePrepared(dir, 300, 299, Ramp(200, 300), Ramp(80, 300));
  // Without counts and CRCs (an older dataset.json, or one written by hand): loads unchecked.
  ASSERT_OK(LoadDatasetSpec("prepared:" + dir, 0).status());
  RecordPreparedChecks(dir, 300, 299);
  ASSERT_OK_AND_ASSIGN(TokenDataset train, LoadDatasetSpec("prepared:" + dir, 0));
  ASSERT_OK_AND_ASSIGN(std::optional<TokenDataset> val, LoadEvalSplitOf("prepared:" + dir));
  ASSERT_TRUE(val.has_value());

  // The train files replaced by the val files: the token count differs.
  const std::string train_bin = ReadFile(dir + "/train.bin"), train_idx = ReadFile(dir + "/train.idx");
  WriteFile(dir + "/train.bin", ReadFile(dir + "/val.bin"));
  WriteFile(dir + "/train.idx", ReadFile(dir + "/val.idx"));
  EXPECT_THAT(LoadDatasetSpec("prepared:" + dir, 0),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("prepared dataset '", dir, "/train.bin': 80 tokens, '",
                                              dir, "/dataset.json' says 200: the files were "
                                              "replaced or changed"))));

  // One byte of the .bin changed between the loader's sampled blocks: the CRC differs.
  std::string changed = train_bin;
  changed[2 * 150] ^= 0x01;
  WriteFile(dir + "/train.bin", changed);
  WriteFile(dir + "/train.idx", train_idx);
  EXPECT_THAT(LoadDatasetSpec("prepared:" + dir, 0),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("'", dir, "/train.bin': CRC-32C 0x"))));

  // Two sequences instead of one over the same tokens: the document count differs.
  WriteFile(dir + "/train.bin", train_bin);
  WriteFile(dir + "/train.idx", MegatronIdx(8, 2, {100, 100}, {0, 1, 2}));
  EXPECT_THAT(LoadDatasetSpec("prepared:" + dir, 0),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("'", dir, "/train.idx': 2 documents, '", dir,
                                              "/dataset.json' says 1"))));
  // The same document count, other sequence lengths: the .idx's CRC differs.
  WriteFile(dir + "/train.idx", MegatronIdx(8, 2, {100, 100}, {0, 2}));
  EXPECT_THAT(LoadDatasetSpec("prepared:" + dir, 0),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("'", dir, "/train.idx': CRC-32C 0x"))));

  // The val split is checked as well.
  WriteFile(dir + "/train.idx", train_idx);
  WriteFile(dir + "/val.bin", ReadFile(dir + "/val.bin").substr(0, 120));
  WriteFile(dir + "/val.idx", MegatronIdx(8, 2, {60}, {0, 1}));
  ASSERT_OK(LoadDatasetSpec("prepared:" + dir, 0).status());
  EXPECT_THAT(LoadEvalSplitOf("prepared:" + dir),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("/val.bin': 60 tokens")));
}

TEST(FileCrc, EveryFileFormCarriesTheCrcOfItsBytes) {
  const std::string text = TempPath("crc.txt");
  WriteFile(text, "hello crc");
  ASSERT_OK_AND_ASSIGN(TokenDataset t, LoadTextFile(text));
  EXPECT_EQ(t.file_crc32c, Crc32c("hello crc", 9));
  EXPECT_FALSE(t.index_crc32c.has_value());
  EXPECT_TRUE(t.document_ends.empty());

  const std::string prefix = TempPath("crc_mega");
  const std::string idx = MegatronIdx(4, 4, {2, 1, 3}, {0, 2, 3});
  std::string bin;
  for (int32_t v : {10, 11, 20, 30, 31, 32}) Put<int32_t>(&bin, v);
  WriteFile(prefix + ".idx", idx);
  WriteFile(prefix + ".bin", bin);
  ASSERT_OK_AND_ASSIGN(TokenDataset m, LoadMegatronDataset(prefix));
  EXPECT_EQ(m.file_crc32c, Crc32c(bin.data(), bin.size()));
  EXPECT_EQ(m.index_crc32c, Crc32c(idx.data(), idx.size()));
  EXPECT_THAT(m.document_ends, ElementsAre(3, 6));  // documents: sequences {0, 1} and {2}

  ASSERT_OK_AND_ASSIGN(SyntheticCorpus synthetic, MakeSyntheticCorpus({1, 1000}));
  EXPECT_FALSE(synthetic.data.file_crc32c.has_value());
}


TEST(Prepared, BadDatasetJson) {
  const std::string dir = TempPath("prepared_bad");
  WritePrepared(dir, 300, 300, Ramp(100, 300), Ramp(100, 300));
  EXPECT_THAT(ReadPreparedInfo(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected vocab_size >= 1 and 0 <= eod_token < vocab_size")));
  WritePrepared(dir, 300, 1, Ramp(100, 300), Ramp(100, 300), ", \"colour\": 1");
  EXPECT_THAT(ReadPreparedInfo(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a dataset.json of tools/prepare_data.py")));
  WriteFile(dir + "/dataset.json",
            "{\"format\": \"orthoshard-prepared-dataset\", \"version\": 1, \"vocab_size\": 9, "
            "\"eod_token\": 0, \"tokenizer\": \"../t.json\", \"train\": {\"prefix\": \"train\"}}");
  EXPECT_THAT(ReadPreparedInfo(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be file names inside the directory")));
  EXPECT_THAT(ReadPreparedInfo(TempPath("prepared_absent")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("dataset.json")));
}

// A key given twice would take the last value (protobuf's JSON mapping): refused, naming the key and
// the file; so is nesting past the scan's limit, at any depth of input, in one pass.
TEST(Prepared, DatasetJsonWithADuplicateKeyIsRefused) {
  const std::string dir = TempPath("prepared_duplicate");
  WritePrepared(dir, 300, 1, Ramp(100, 300), Ramp(100, 300), ", \"vocab_size\": 65536");
  EXPECT_THAT(ReadPreparedInfo(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prepared dataset '" + dir + "/dataset.json': not a dataset.json of "
                                 "tools/prepare_data.py: JSON object has the key \"vocab_size\" "
                                 "twice (byte ")));
  WritePrepared(dir, 300, 1, Ramp(100, 300), Ramp(100, 300),
                ", \"sources\": " + std::string(200000, '[') + std::string(200000, ']'));
  EXPECT_THAT(ReadPreparedInfo(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dataset.json': not a dataset.json of tools/prepare_data.py: JSON "
                                 "nests deeper than 8 levels at byte ")));
  WritePrepared(dir, 300, 1, Ramp(100, 300), Ramp(100, 300));
  EXPECT_OK(ReadPreparedInfo(dir).status());
}

}  // namespace
}  // namespace orthoshard::data
