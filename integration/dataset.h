// Token datasets for pretraining: an embedded synthetic corpus and three on-disk formats.
//
// Every source becomes a TokenDataset: one flat stream of token ids (documents concatenated in file
// order, as nanoGPT trains) plus the vocabulary size they were checked against. Files are read
// whole into memory, which suits the datasets this project trains on in tests and examples.
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
//
// Every parser returns a Status naming the file and what was expected; none aborts on bad input.
#ifndef ORTHOSHARD_INTEGRATION_DATASET_H_
#define ORTHOSHARD_INTEGRATION_DATASET_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::integration {

struct TokenDataset {
  std::string name;             // where it came from, for messages ("synthetic", a path)
  int64_t vocab_size = 0;       // every token is in [0, vocab_size)
  std::vector<int32_t> tokens;  // the flat stream
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
double UnigramEntropy(const std::vector<int32_t>& tokens);

// ---- Files ---------------------------------------------------------------------------------------

// Raw bytes as tokens (vocab 256). Errors: kNotFound for a missing file ("data file '<path>': cannot
// open: No such file or directory"); kInvalidArgument for an empty file.
absl::StatusOr<TokenDataset> LoadTextFile(const std::string& path);

// nanoGPT uint16 tokens. Errors: kNotFound; kInvalidArgument for an empty file, a size that is not
// a multiple of 2, or a token >= vocab_size ("token 300 at index 2 is >= vocab size 256").
absl::StatusOr<TokenDataset> LoadNanoGptFile(const std::string& path, int64_t vocab_size);

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

// Loads `<prefix>.idx` and `<prefix>.bin`; sequences are concatenated in order. Errors: as
// ParseMegatronIndex; kNotFound for a missing file; kInvalidArgument for a float dtype, a .bin of
// the wrong size, or a token outside [0, vocab_size).
absl::StatusOr<TokenDataset> LoadMegatronDataset(const std::string& prefix, int64_t vocab_size);

// Loads a dataset from a one-string description, as a `--data` flag gives it:
//   "synthetic" or "synthetic:<tokens>"  MakeSyntheticCorpus({seed, tokens}) (default 1M tokens)
//   "text:<path>"                        LoadTextFile
//   "nanogpt:<path>"                     LoadNanoGptFile(path, vocab_size)
//   "megatron:<prefix>"                  LoadMegatronDataset(prefix, vocab_size)
// Errors: kInvalidArgument for an unknown kind or a bad token count ("data spec 'csv:x': expected
// synthetic[:TOKENS], text:PATH, nanogpt:PATH or megatron:PREFIX"); otherwise as the loader called.
absl::StatusOr<TokenDataset> LoadDatasetSpec(absl::string_view spec, int64_t vocab_size,
                                             uint64_t seed);

// A lower bound on the tokens LoadDatasetSpec(spec) would hold, from the spec and the file sizes
// alone (synthetic: its count; text: one per byte; nanogpt: one per 2 bytes; megatron: one per 8
// bytes of .bin at least); 0 when it cannot tell (LoadDatasetSpec then reports the problem).
int64_t DatasetSpecMinTokens(absl::string_view spec);

// Splits off the last `eval_fraction` of the tokens (rounded up) as a held-out eval set; the rest is
// the training set. Errors: kInvalidArgument for a fraction outside (0, 1) or when either part would
// have fewer than `min_tokens` tokens.
absl::StatusOr<std::pair<TokenDataset, TokenDataset>> SplitTrainEval(const TokenDataset& data,
                                                                     double eval_fraction,
                                                                     int64_t min_tokens);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_DATASET_H_
