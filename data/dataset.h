// Token datasets for pretraining: an embedded synthetic corpus and four on-disk formats.
//
// Every source becomes a TokenDataset: one flat stream of token ids (documents concatenated in file
// order, as nanoGPT and Megatron-LM's GPT dataset train), the largest id in it, and, when the data
// marks the ends of its documents, the end-of-document (EOD) token. Files are memory-mapped read-only
// and read in their own integer type, never copied: the ranks of one machine share one copy in the
// page cache instead of each holding the corpus (every token is read once at load, to check its
// range; those pages are then dropped from the process). A data file replaced by a rename (as
// tools/prepare_data.py --overwrite does) is safe while a run maps the old one; one truncated in
// place under a running job ends it with SIGBUS, as for any memory-mapped reader (pretrain's last
// line then names the signal and this cause: collectives::DescribeExitCode).
//
// Formats:
//   raw text        any bytes; token = byte value, vocab 256.
//   nanoGPT         `train.bin`: raw little-endian uint16 tokens, no header.
//   Megatron-LM     `<prefix>.idx` + `<prefix>.bin` (MMapIndexedDataset):
//     .idx = "MMIDIDX\0\0" (9 bytes) | u64 version (1) | u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32,
//            5 i64, 6 f64, 7 f32, 8 u16) | u64 sequence count S | u64 document count D |
//            i32 lengths[S] | i64 byte pointers[S] | i64 document index[D]
//     .bin = the tokens of each sequence, back to back, little-endian.
//   The parser accepts only what Megatron writes: pointers contiguous from 0, document index
//   non-decreasing from 0 to S, no trailing bytes, .bin exactly as long as the index says.
//   prepared        a directory written by tools/prepare_data.py: `dataset.json` (vocabulary size,
//                   EOD token, tokenizer file, each split's counts and CRC-32Cs; PreparedDataset in
//                   prepared_dataset.proto), `train.{bin,idx}` and `val.{bin,idx}` (Megatron, every
//                   document ending in EOD), `tokenizer.json` (Hugging Face tokenizers).
//
// Reading every token at load also gives the CRC-32C of every file's bytes (the .bin's, read anyway;
// the .idx is read whole), which a prepared directory's splits are checked against and which the
// loader's resume fingerprint covers.
//
// Every parser returns a Status naming the file and what was expected; none aborts on bad input.
#ifndef ORTHOSHARD_DATA_DATASET_H_
#define ORTHOSHARD_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::data {

// A read-only sequence of token ids: owned in memory, or a memory-mapped file read in its own
// integer type. Copies share the storage; slices are views.
class TokenStream {
 public:
  // Integer types of token files (Megatron's dtype codes name the same ones).
  enum class Type { kUInt8, kInt8, kInt16, kUInt16, kInt32, kInt64 };

  TokenStream() = default;
  explicit TokenStream(std::vector<int32_t> tokens);

  // Maps `path` and views `count` tokens of `type` from byte `offset`. `what` names the file in
  // errors. Errors: kNotFound for a missing file; kInvalidArgument for a directory or other
  // non-regular file, or a file shorter than offset + count tokens; kInternal when mmap fails.
  static absl::StatusOr<TokenStream> MapFile(const std::string& path, int64_t offset,
                                             int64_t count, Type type, absl::string_view what);

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t operator[](int64_t i) const;
  // Copies tokens [start, start + count) into out (the caller keeps the range inside size()).
  void CopyTo(int64_t start, int64_t count, int64_t* out) const;
  // Tokens [start, start + count) as a view sharing this stream's storage.
  TokenStream Slice(int64_t start, int64_t count) const;
  std::vector<int32_t> ToVector() const;  // for tests and small streams
  bool mapped() const { return mapped_; }
  // Tokens [start, start + count) as stored: the file's bytes (its width and byte order), or the
  // owned int32 ids.
  absl::string_view RawBytes(int64_t start, int64_t count) const;

  // Tells the kernel how the mapped pages will be read (MADV_SEQUENTIAL / MADV_RANDOM) or that they
  // are not needed now (MADV_DONTNEED: a shared file mapping drops them from this process, the
  // page cache keeps them). No-op for an owned stream.
  enum class Access { kSequential, kRandom, kDrop };
  void Advise(Access access) const { Advise(access, 0, size_); }
  // The same for tokens [start, start + count) (widened to whole pages).
  void Advise(Access access, int64_t start, int64_t count) const;

 private:
  std::shared_ptr<const void> storage_;  // the owned vector or the mapping
  const char* data_ = nullptr;           // first token
  Type type_ = Type::kInt32;
  int element_size_ = 4;
  int64_t size_ = 0;
  bool mapped_ = false;
};

struct TokenDataset {
  std::string name;        // where it came from, for messages ("synthetic", a path)
  int64_t vocab_size = 0;  // the vocabulary the data comes with (text: 256; prepared: its
                           // tokenizer's); 0 when the format does not say (nanoGPT, Megatron)
  int64_t eod_token = -1;  // the end-of-document id ending every document; -1 when there is none
  TokenStream tokens;      // the flat stream
  int64_t max_token = -1;  // the largest id in `tokens` (every id is >= 0)
  // Megatron: the token offset just past each document the .idx records (ascending, the last is
  // tokens.size()); empty for formats without a document index.
  std::vector<int64_t> document_ends;
  // CRC-32C (common/crc32c.h) of the bytes of the file(s) the tokens came from: the whole token
  // file (.bin, nanoGPT, text), and for Megatron data also the .idx. Absent for the synthetic
  // corpus. A slice (SplitTrainEval) keeps its file's CRCs.
  std::optional<uint32_t> file_crc32c;
  std::optional<uint32_t> index_crc32c;
};

// ---- Synthetic corpus ----------------------------------------------------------------------------

// A seeded probabilistic grammar over bytes with long-range structure. Each line is a sentence
//   "<Name> <w1> <w2> ... <wn>, <Name>.\n"
// Name: one of 8 capitalised names, uniform. n: uniform in [3, 10]. w1: uniform over 48 lowercase
// words; w(k+1): one of 4 fixed successors of w(k) with probabilities 0.5/0.25/0.15/0.1 (a
// first-order Markov chain over words). The closing name repeats the opening one, so predicting it
// needs attention back across the sentence. Words, names and successor lists are drawn from `seed`.
// Every random choice can be read back from the text, so the information content of the corpus is
// exactly the sum of -ln p over the choices made; per byte that is about 0.30 nats (the entropy
// rate: the loss a perfect model reaches), against about 3.3 nats of unigram (byte-frequency)
// entropy (what a model without context reaches). The tiny GPT gets to about 0.46 nats in 300 steps.
struct SyntheticOptions {
  uint64_t seed = 1234;
  int64_t num_tokens = 1 << 20;  // bytes to generate (the last sentence is cut off there)
};

struct SyntheticCorpus {
  TokenDataset data;                   // vocab 256
  double entropy_nats_per_token = 0;   // information of the choices made / tokens: the achievable loss
  double unigram_entropy_nats = 0;     // entropy of the byte frequencies: a context-free model's loss
};

// Deterministic in `options`: the same seed gives the same bytes on every platform.
// Errors: kInvalidArgument when num_tokens < 64.
absl::StatusOr<SyntheticCorpus> MakeSyntheticCorpus(const SyntheticOptions& options);

// Entropy (nats) of the empirical distribution of `tokens`. 0 for an empty stream.
double UnigramEntropy(const TokenStream& tokens);

// ---- Files ---------------------------------------------------------------------------------------

// Raw bytes as tokens (vocab 256). Errors: kNotFound for a missing file ("data file '<path>': cannot
// open: No such file or directory"); kInvalidArgument for an empty file.
absl::StatusOr<TokenDataset> LoadTextFile(const std::string& path);

// nanoGPT uint16 tokens (vocab_size 0: the format does not record it). Errors: kNotFound;
// kInvalidArgument for an empty file or a size that is not a multiple of 2.
absl::StatusOr<TokenDataset> LoadNanoGptFile(const std::string& path);

// The parsed `.idx` of a Megatron indexed dataset.
struct MegatronIndex {
  int dtype_code = 0;                  // 1..8 as in the file comment
  int64_t element_size = 0;            // bytes per token
  std::vector<int32_t> lengths;        // [S] tokens per sequence
  std::vector<int64_t> pointers;       // [S] byte offsets into .bin
  std::vector<int64_t> document_index; // [D] sequence index where each document starts; ends at S
  int64_t bin_bytes() const;           // bytes the .bin must have
};

// Parses `.idx` bytes; `name` prefixes every message. Errors: kInvalidArgument (wrong magic,
// version, dtype code; counts or pointers inconsistent) or kDataLoss (truncated), e.g.
// "megatron index 'x.idx': bad magic, expected \"MMIDIDX\\0\\0\"".
absl::StatusOr<MegatronIndex> ParseMegatronIndex(absl::string_view bytes, absl::string_view name);

// Loads `<prefix>.idx` and `<prefix>.bin`; sequences are concatenated in order (vocab_size 0).
// Errors: as ParseMegatronIndex; kNotFound for a missing file; kInvalidArgument for a float dtype,
// a .bin of the wrong size or a negative token.
absl::StatusOr<TokenDataset> LoadMegatronDataset(const std::string& prefix);

// One split of a prepared directory as dataset.json records it. The counts and CRCs are absent when
// dataset.json lacks them (CRCs: directories prepared before tools/prepare_data.py recorded them).
struct PreparedSplit {
  std::string prefix;                   // dir/train
  std::optional<int64_t> documents;     // documents the .idx holds
  std::optional<int64_t> tokens;        // tokens the .bin holds
  std::optional<uint32_t> bin_crc32c;   // CRC-32C of the .bin
  std::optional<uint32_t> idx_crc32c;   // CRC-32C of the .idx
};

// What a prepared directory's dataset.json says.
struct PreparedInfo {
  std::string dir;
  std::string json_path;        // dir/dataset.json
  int64_t vocab_size = 0;
  int64_t eod_token = -1;
  std::string tokenizer_path;   // dir/tokenizer.json
  PreparedSplit train;
  std::optional<PreparedSplit> val;  // absent when the directory has no validation split
};
// Errors: kNotFound without DIR/dataset.json; kInvalidArgument for JSON that is not a
// PreparedDataset of a known version, or whose vocabulary, EOD token, split names or counts are
// invalid.
absl::StatusOr<PreparedInfo> ReadPreparedInfo(const std::string& dir);

// Loads one split of a prepared directory (LoadMegatronDataset) with the directory's vocabulary and
// EOD token, and checks its files against dataset.json: token count, document count, the .idx's and
// the .bin's CRC-32C, each that dataset.json records. The CRC costs nothing extra: every token is
// read at load anyway. Errors: as LoadMegatronDataset; kDataLoss naming the file and what differs
// ("prepared dataset 'd/train.bin': 4000 tokens, 'd/dataset.json' says 4800: ...").
absl::StatusOr<TokenDataset> LoadPreparedSplit(const PreparedInfo& info, const PreparedSplit& split);

// Splits off the last `eval_fraction` of the tokens (rounded up) as a held-out eval set; the rest is
// the training set (both views of `data`'s tokens; document_ends cut and shifted to each part).
// Errors: kInvalidArgument for a fraction outside (0, 1) or when either part would have fewer than
// `min_tokens` tokens.
absl::StatusOr<std::pair<TokenDataset, TokenDataset>> SplitTrainEval(const TokenDataset& data,
                                                                     double eval_fraction,
                                                                     int64_t min_tokens);

}  // namespace orthoshard::data

#endif  // ORTHOSHARD_DATA_DATASET_H_
