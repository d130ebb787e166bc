// The one-string description of a dataset that `--data` and `--eval_data` give ("prepared:DIR"),
// parsed once into a DataKind, and what can be done with one: load it, load the held-out split it
// brings, describe its vocabulary without loading, and say what it costs each process.
#ifndef ORTHOSHARD_DATA_DATA_SPEC_H_
#define ORTHOSHARD_DATA_DATA_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/dataset.h"

namespace orthoshard::data {

// The formats of dataset.h, as a spec names them.
enum class DataKind { kSynthetic, kText, kNanoGpt, kMegatron, kPrepared };

// "synthetic", "text", "nanogpt", "megatron", "prepared".
absl::string_view DataKindName(DataKind kind);

struct DataSpec {
  DataKind kind = DataKind::kSynthetic;
  std::string path;                       // the file, prefix or directory (empty for synthetic)
  std::optional<int64_t> synthetic_tokens;  // "synthetic:<tokens>"
};

// Parses a spec (the forms LoadDatasetSpec lists). Errors: kInvalidArgument for an unknown kind,
// a missing path or a token count that is not an integer ("data spec 'csv:x': expected
// synthetic[:TOKENS], text:PATH, nanogpt:PATH, megatron:PREFIX or prepared:DIR").
absl::StatusOr<DataSpec> ParseDataSpec(absl::string_view spec);

// Loads a dataset from a one-string description, as a `--data` flag gives it:
//   "synthetic" or "synthetic:<tokens>"  MakeSyntheticCorpus({seed, tokens}) (default 1M tokens)
//   "text:<path>"                        LoadTextFile
//   "nanogpt:<path>"                     LoadNanoGptFile
//   "megatron:<prefix>"                  LoadMegatronDataset
//   "prepared:<dir>"                     LoadPreparedSplit of its train split
// No vocabulary check here: the caller compares max_token with its model's vocabulary.
// Errors: kInvalidArgument for an unknown kind or a bad token count ("data spec 'csv:x': expected
// synthetic[:TOKENS], text:PATH, nanogpt:PATH, megatron:PREFIX or prepared:DIR"); otherwise as the
// loader called.
absl::StatusOr<TokenDataset> LoadDatasetSpec(absl::string_view spec, uint64_t seed);

// The held-out split a spec's data brings along: a prepared directory's val split (LoadPreparedSplit),
// or nullopt for other data and a prepared directory without one (the caller then splits the
// training data, SplitTrainEval). Errors: as ReadPreparedInfo and LoadPreparedSplit.
absl::StatusOr<std::optional<TokenDataset>> LoadEvalSplitOf(absl::string_view spec);

// The vocabulary and EOD token a spec's data comes with, read without loading the tokens
// (prepared: dataset.json; text and synthetic: 256 and none; others: 0 and none). Errors: as
// ReadPreparedInfo.
absl::StatusOr<TokenDataset> DescribeDatasetSpec(absl::string_view spec);

// The bytes LoadDatasetSpec(spec)'s tokens take in each process: the synthetic corpus is generated
// into memory; files are mapped, so their pages are the machine's shared page cache, not a rank's.
int64_t DatasetSpecResidentBytes(absl::string_view spec);

}  // namespace orthoshard::data

#endif  // ORTHOSHARD_DATA_DATA_SPEC_H_
