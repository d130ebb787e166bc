#include "data/loader.h"

#include <algorithm>
#include <iterator>
#include <vector>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace orthoshard::data {
namespace {

// SplitMix64 (Steele et al. 2014): decorrelates the per-epoch seeds.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

absl::Status Mismatch(absl::string_view field, const std::string& saved, const std::string& now) {
  return absl::FailedPreconditionError(
      absl::StrCat("loader resume: ", field, " ", saved, " in the saved state, ", now, " now"));
}

// LoaderState::data_fingerprint of `tokens`: the CRC of the blocks' ids as little-endian int32,
// whatever type the file stores them in.
uint32_t DataFingerprint(const TokenStream& tokens) {
  constexpr int64_t kBlocks = 64, kBlockTokens = 1024;
  const int64_t n = tokens.size();
  uint32_t crc = Crc32c(&n, sizeof(n));
  const int64_t block = std::min(kBlockTokens, n);
  std::vector<int64_t> wide(block);
  std::vector<int32_t> ids(block);
  for (int64_t b = 0; b < kBlocks && block > 0; ++b) {
    const int64_t start = (n - block) * b / (kBlocks - 1);
    tokens.CopyTo(start, block, wide.data());
    std::copy(wide.begin(), wide.end(), ids.begin());
    crc = Crc32cExtend(crc, ids.data(), block * sizeof(int32_t));
  }
  return crc;
}

// LoaderState::content_crc32c of `data`, when its file CRCs are known.
std::optional<uint32_t> ContentCrc(const TokenDataset& data) {
  if (!data.file_crc32c.has_value()) return std::nullopt;
  const uint32_t crcs[2] = {*data.file_crc32c, data.index_crc32c.value_or(0)};
  return Crc32c(crcs, sizeof(crcs));
}

// A seeded permutation of [0, n): Fisher–Yates with the raw engine output (exact across standard
// libraries), or the identity without shuffling.
void Permute(int64_t n, bool shuffle, uint64_t seed, std::vector<int64_t>* permutation) {
  permutation->resize(n);
  std::iota(permutation->begin(), permutation->end(), 0);
  if (!shuffle) return;
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap((*permutation)[i], (*permutation)[rng() % static_cast<uint64_t>(i + 1)]);
  }
}


}  // namespace

absl::StatusOr<std::vector<int64_t>> DocumentEnds(const TokenDataset& data, int64_t eod) {
  const int64_t n = data.tokens.size();
  std::vector<int64_t> ends;
  for (const int64_t end : data.document_ends) {
    if (end > 0 && end <= n) ends.push_back(end);
  }
  if (eod >= 0) {
    constexpr int64_t kBlock = int64_t{1} << 16;
    std::vector<int64_t> block(kBlock);
    std::vector<int64_t> eod_ends;
    for (int64_t start = 0; start < n; start += kBlock) {
      const int64_t count = std::min(kBlock, n - start);
      data.tokens.CopyTo(start, count, block.data());
      for (int64_t i = 0; i < count; ++i) {
        if (block[i] == eod) eod_ends.push_back(start + i + 1);
      }
    }
    std::vector<int64_t> merged;
    std::merge(ends.begin(), ends.end(), eod_ends.begin(), eod_ends.end(),
               std::back_inserter(merged));
    ends = std::move(merged);
  }
  ends.push_back(n);
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  if (ends.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data loader: sample_order documents needs documents (EOD tokens or a document index); "
        "dataset '", data.name, "' is one document of ", n, " tokens",
        eod >= 0 ? absl::StrCat(" (no EOD token ", eod, " in it)") : std::string()));
  }
  return ends;
}

absl::string_view SampleOrderName(SampleOrder order) {
  return order == SampleOrder::kDocuments ? "documents" : "windows";
}

std::string LoaderState::Serialize() const {
  return absl::StrCat("loader v2 step=", step, " seed=", seed, " seq_len=", seq_len,
                      " global_batch=", global_batch, " num_windows=", num_windows,
                      " shuffle=", shuffle ? 1 : 0,
                      " data=", absl::Hex(data_fingerprint, absl::kZeroPad8),
                      content_crc32c.has_value()
                          ? absl::StrCat(" content=", absl::Hex(*content_crc32c, absl::kZeroPad8))
                          : "",
                      sample_order == SampleOrder::kDocuments ? " order=documents" : "");
}

absl::StatusOr<LoaderState> LoaderState::Parse(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (parts.size() < 9 || parts.size() > 11 || parts[0] != "loader" || parts[1] != "v2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "loader state: expected \"loader v2\" and 7 to 9 fields, got \"", text, "\""));
  }
  LoaderState state;
  int64_t shuffle = 1;
  const std::pair<absl::string_view, int64_t*> fields[] = {
      {"step", &state.step},   {"seq_len", &state.seq_len},         {"global_batch", &state.global_batch},
      {"num_windows", &state.num_windows}, {"shuffle", &shuffle}};
  for (size_t i = 2; i < parts.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(parts[i], '=');
    bool ok = false;
    if (kv.first == "seed") {
      ok = absl::SimpleAtoi(kv.second, &state.seed);
    } else if (kv.first == "data") {
      ok = kv.second.size() == 8 && absl::SimpleHexAtoi(kv.second, &state.data_fingerprint);
    } else if (kv.first == "order" && i >= 9) {
      ok = kv.second == "windows" || kv.second == "documents";
      state.sample_order =
          kv.second == "documents" ? SampleOrder::kDocuments : SampleOrder::kWindows;
    } else if (kv.first == "content" && i == 9) {
      uint32_t crc = 0;
      ok = kv.second.size() == 8 && absl::SimpleHexAtoi(kv.second, &crc);
      state.content_crc32c = crc;
    } else {
      for (const auto& [name, target] : fields) {
        if (kv.first == name) ok = absl::SimpleAtoi(kv.second, target);
      }
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("loader state: malformed field \"", parts[i], "\""));
    }
  }
  state.shuffle = shuffle != 0;
  return state;
}

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> data, const LoaderOptions& options)
    : data_(std::move(data)), options_(options) {}

absl::StatusOr<DataLoader> DataLoader::Create(std::shared_ptr<const TokenDataset> data,
                                              const LoaderOptions& options) {
  if (data == nullptr) return absl::InvalidArgumentError("data loader: dataset is null");
  if (options.seq_len < 1 || options.micro_batch_size < 1 || options.micro_batches < 1 ||
      options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data loader: seq_len, micro_batch_size, micro_batches and world_size must be >= 1, got ",
        options.seq_len, ", ", options.micro_batch_size, ", ", options.micro_batches, ", ",
        options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("data loader: rank ", options.rank,
                                                   " is outside [0, ", options.world_size, ")"));
  }
  if (options.mask_eod_loss && options.eod_token < 0) {
    return absl::InvalidArgumentError(
        "data loader: mask_eod_loss needs an EOD token (eod_token >= 0)");
  }
  if (options.reset_at_documents && options.eod_token < 0 && data->document_ends.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data loader: reset_at_documents needs an EOD token (eod_token >= 0) or a document index; "
        "dataset '", data->name, "' has neither"));
  }
  const int64_t n = data->tokens.size();
  if (n < options.seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat("dataset '", data->name, "' has ", n,
                                                   " tokens, seq_len ", options.seq_len,
                                                   " needs at least ", options.seq_len + 1));
  }
  DataLoader loader(std::move(data), options);
  loader.global_batch_ = options.world_size * options.micro_batches * options.micro_batch_size;
  loader.num_windows_ = (n - 1) / options.seq_len;
  loader.data_fingerprint_ = DataFingerprint(loader.data_->tokens);
  loader.content_crc32c_ = ContentCrc(*loader.data_);
  if (options.sample_order == SampleOrder::kDocuments) {
    ASSIGN_OR_RETURN(loader.document_ends_, DocumentEnds(*loader.data_, options.eod_token));
  }
  return loader;
}

void DataLoader::CacheEpoch(int64_t epoch) const {
  if (epoch == cached_epoch_) return;
  const uint64_t epoch_seed = Mix(options_.seed ^ Mix(static_cast<uint64_t>(epoch)));
  Permute(num_windows_, options_.shuffle, epoch_seed, &permutation_);
  if (shuffled_documents()) {
    // Another stream of the same (seed, epoch) for the documents.
    const int64_t documents = static_cast<int64_t>(document_ends_.size());
    Permute(documents, /*shuffle=*/true, Mix(epoch_seed ^ 0x646f63756d656e74ull),
            &document_order_);
    stream_ends_.resize(documents);
    int64_t end = 0;
    for (int64_t i = 0; i < documents; ++i) {
      const int64_t d = document_order_[i];
      end += document_ends_[d] - (d > 0 ? document_ends_[d - 1] : 0);
      stream_ends_[i] = end;
    }
  }
  cached_epoch_ = epoch;
}

int64_t DataLoader::WindowOf(int64_t global_sample) const {
  const int64_t index = global_sample % num_windows_;
  if (!options_.shuffle) return index;
  CacheEpoch(global_sample / num_windows_);
  return permutation_[index];
}

void DataLoader::CopySample(int64_t global_sample, int64_t count, int64_t* out,
                            std::vector<int64_t>* ends) const {
  const int64_t start = WindowOf(global_sample) * options_.seq_len;
  ends->clear();
  if (!shuffled_documents()) {
    data_->tokens.CopyTo(start, count, out);
    const std::vector<int64_t>& index = data_->document_ends;
    for (auto it = std::upper_bound(index.begin(), index.end(), start);
         it != index.end() && *it <= start + count; ++it) {
      ends->push_back(*it - start);
    }
    return;
  }
  // The documents of the epoch's stream that [start, start + count) overlaps, piece by piece.
  int64_t i = std::upper_bound(stream_ends_.begin(), stream_ends_.end(), start) -
              stream_ends_.begin();
  for (int64_t done = 0; done < count; ++i) {
    const int64_t d = document_order_[i];
    const int64_t document_start = d > 0 ? document_ends_[d - 1] : 0;
    const int64_t offset = start + done - (i > 0 ? stream_ends_[i - 1] : 0);
    const int64_t piece = std::min(count - done, document_ends_[d] - document_start - offset);
    data_->tokens.CopyTo(document_start + offset, piece, out + done);
    done += piece;
    if (stream_ends_[i] <= start + count) ends->push_back(stream_ends_[i] - start);
  }
}

std::vector<MicroBatch> DataLoader::BatchAt(int64_t step) const {
  const int64_t S = options_.seq_len, rows = options_.micro_batch_size;
  const int64_t per_rank = options_.micro_batches * rows;
  const int64_t first = step * global_batch_ + options_.rank * per_rank;
  const int64_t eod = options_.eod_token;
  std::vector<int64_t> window_tokens(S + 1);
  std::vector<int64_t> ends;  // CopySample's: offsets past a document's last token in the sample
  std::vector<MicroBatch> batches(options_.micro_batches);
  for (int64_t m = 0; m < options_.micro_batches; ++m) {
    MicroBatch& b = batches[m];
    b.rows = rows;
    b.cols = S;
    b.inputs.resize(rows * S);
    b.targets.resize(rows * S);
    if (options_.reset_at_documents) {
      b.segments.resize(rows * S);
      b.positions.resize(rows * S);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t sample = first + m * rows + r;
      CopySample(sample, S + 1, window_tokens.data(), &ends);
      auto next_end = ends.begin();
      int64_t segment = 0, position = 0;
      for (int64_t t = 0; t < S; ++t) {
        const int64_t i = r * S + t;
        const bool at_eod = window_tokens[t] == eod && eod >= 0;
        bool at_end = false;  // (an empty document repeats the end before it)
        for (; next_end != ends.end() && *next_end <= t + 1; ++next_end) {
          at_end = at_end || *next_end == t + 1;
        }
        b.inputs[i] = window_tokens[t];
        b.targets[i] = at_eod && options_.mask_eod_loss ? kIgnoreTarget : window_tokens[t + 1];
        if (b.targets[i] != kIgnoreTarget) ++b.counted_targets;
        if (options_.reset_at_documents) {
          b.segments[i] = segment;
          b.positions[i] = position++;
          if (at_eod || at_end) {  // the token ends its document; the next starts one
            ++segment;
            position = 0;
            if (t + 1 < S) b.has_boundaries = true;
          }
        }
      }
      b.sample_ids.push_back(sample);
      b.windows.push_back(WindowOf(sample));
    }
  }
  return batches;
}

int64_t DataLoader::CountedTargets(int64_t step) const {
  const int64_t S = options_.seq_len;
  if (!options_.mask_eod_loss) return global_batch_ * S;
  std::vector<int64_t> window_tokens(S);
  std::vector<int64_t> ends;
  int64_t counted = 0;
  for (int64_t j = 0; j < global_batch_; ++j) {
    CopySample(step * global_batch_ + j, S, window_tokens.data(), &ends);
    for (int64_t t = 0; t < S; ++t) counted += window_tokens[t] != options_.eod_token;
  }
  return counted;
}

std::vector<MicroBatch> DataLoader::Next() { return BatchAt(step_++); }

LoaderState DataLoader::state() const {
  return {step_,        options_.seed,    options_.seq_len,  global_batch_,
          num_windows_, options_.shuffle, data_fingerprint_, content_crc32c_,
          options_.sample_order};
}

absl::Status DataLoader::Restore(const LoaderState& state) {
  if (state.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loader resume: step must be >= 0, got ", state.step));
  }
  const LoaderState now = this->state();
  if (state.seed != now.seed) return Mismatch("seed", absl::StrCat(state.seed), absl::StrCat(now.seed));
  if (state.seq_len != now.seq_len) {
    return Mismatch("seq_len", absl::StrCat(state.seq_len), absl::StrCat(now.seq_len));
  }
  if (state.global_batch != now.global_batch) {
    return Mismatch("global batch", absl::StrCat(state.global_batch), absl::StrCat(now.global_batch));
  }
  if (state.num_windows != now.num_windows) {
    return Mismatch("window count (dataset size)", absl::StrCat(state.num_windows),
                    absl::StrCat(now.num_windows));
  }
  if (state.shuffle != now.shuffle) {
    return Mismatch("shuffle", state.shuffle ? "on" : "off", now.shuffle ? "on" : "off");
  }
  if (state.sample_order != now.sample_order) {
    return Mismatch("sample_order", std::string(SampleOrderName(state.sample_order)),
                    std::string(SampleOrderName(now.sample_order)));
  }
  if (state.data_fingerprint != now.data_fingerprint) {
    return Mismatch("data fingerprint (another dataset of the same size?)",
                    absl::StrCat(absl::Hex(state.data_fingerprint, absl::kZeroPad8)),
                    absl::StrCat(absl::Hex(now.data_fingerprint, absl::kZeroPad8)));
  }
  if (state.content_crc32c.has_value() && now.content_crc32c.has_value() &&
      *state.content_crc32c != *now.content_crc32c) {
    return Mismatch("content CRC-32C (the data's files changed)",
                    absl::StrCat(absl::Hex(*state.content_crc32c, absl::kZeroPad8)),
                    absl::StrCat(absl::Hex(*now.content_crc32c, absl::kZeroPad8)));
  }
  step_ = state.step;
  return absl::OkStatus();
}

}  // namespace orthoshard::data
