#include "data/data_spec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::data {
namespace {

struct KindName {
  DataKind kind;
  absl::string_view name;
};
constexpr KindName kKindNames[] = {{DataKind::kSynthetic, "synthetic"},
                                   {DataKind::kText, "text"},
                                   {DataKind::kNanoGpt, "nanogpt"},
                                   {DataKind::kMegatron, "megatron"},
                                   {DataKind::kPrepared, "prepared"}};

absl::Status BadSpec(absl::string_view spec) {
  return absl::InvalidArgumentError(absl::StrCat(
      "data spec '", spec,
      "': expected synthetic[:TOKENS], text:PATH, nanogpt:PATH, megatron:PREFIX or prepared:DIR"));
}

}  // namespace

absl::string_view DataKindName(DataKind kind) {
  for (const KindName& k : kKindNames) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

absl::StatusOr<DataSpec> ParseDataSpec(absl::string_view spec) {
  const size_t colon = spec.find(':');
  const absl::string_view name = spec.substr(0, colon);
  const bool has_arg = colon != absl::string_view::npos;
  const absl::string_view arg = has_arg ? spec.substr(colon + 1) : absl::string_view();
  const KindName* found = nullptr;
  for (const KindName& k : kKindNames) {
    if (k.name == name) found = &k;
  }
  if (found == nullptr) return BadSpec(spec);
  DataSpec out;
  out.kind = found->kind;
  if (out.kind == DataKind::kSynthetic) {
    if (has_arg) {
      int64_t tokens = 0;
      if (!absl::SimpleAtoi(arg, &tokens)) return BadSpec(spec);
      out.synthetic_tokens = tokens;
    }
    return out;
  }
  if (arg.empty()) return BadSpec(spec);
  out.path = std::string(arg);
  return out;
}

absl::StatusOr<TokenDataset> LoadDatasetSpec(absl::string_view spec, uint64_t seed) {
  ASSIGN_OR_RETURN(const DataSpec parsed, ParseDataSpec(spec));
  switch (parsed.kind) {
    case DataKind::kSynthetic: {
      SyntheticOptions options;
      options.seed = seed;
      if (parsed.synthetic_tokens.has_value()) options.num_tokens = *parsed.synthetic_tokens;
      ASSIGN_OR_RETURN(SyntheticCorpus corpus, MakeSyntheticCorpus(options));
      return std::move(corpus.data);
    }
    case DataKind::kText:
      return LoadTextFile(parsed.path);
    case DataKind::kNanoGpt:
      return LoadNanoGptFile(parsed.path);
    case DataKind::kMegatron:
      return LoadMegatronDataset(parsed.path);
    case DataKind::kPrepared: {
      ASSIGN_OR_RETURN(const PreparedInfo info, ReadPreparedInfo(parsed.path));
      return LoadPreparedSplit(info, info.train);
    }
  }
  return BadSpec(spec);
}

absl::StatusOr<std::optional<TokenDataset>> LoadEvalSplitOf(absl::string_view spec) {
  const absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
  if (!parsed.ok() || parsed->kind != DataKind::kPrepared) return std::nullopt;
  ASSIGN_OR_RETURN(const PreparedInfo info, ReadPreparedInfo(parsed->path));
  if (!info.val.has_value()) return std::nullopt;
  return LoadPreparedSplit(info, *info.val);
}

absl::StatusOr<TokenDataset> DescribeDatasetSpec(absl::string_view spec) {
  TokenDataset data;
  data.name = std::string(spec);
  const absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
  if (!parsed.ok()) return data;  // LoadDatasetSpec says what is wrong with it
  if (parsed->kind == DataKind::kSynthetic || parsed->kind == DataKind::kText) {
    data.vocab_size = 256;
  }
  if (parsed->kind == DataKind::kPrepared) {
    ASSIGN_OR_RETURN(const PreparedInfo info, ReadPreparedInfo(parsed->path));
    data.vocab_size = info.vocab_size;
    data.eod_token = info.eod_token;
  }
  return data;
}

int64_t DatasetSpecResidentBytes(absl::string_view spec) {
  const absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
  // Files are mapped: shared page cache, not rank memory.
  if (!parsed.ok() || parsed->kind != DataKind::kSynthetic) return 0;
  const int64_t tokens = parsed->synthetic_tokens.value_or(SyntheticOptions().num_tokens);
  return std::max<int64_t>(tokens, 0) * (4 + 1);  // int32 tokens + the generated text
}

}  // namespace orthoshard::data
