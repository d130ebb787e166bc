// Deterministic per-rank batches over a TokenDataset, with a resumable position.
//
// The dataset is cut into W = (n - 1) / seq_len non-overlapping windows; window w gives inputs
// tokens[w*S, w*S + S) and targets shifted by one. The global sample sequence is epoch after epoch
// of the windows, each epoch in its own seeded permutation (or in order when shuffle is off, as for
// eval). Step s consumes global samples [s*G, (s+1)*G) where G = world_size * micro_batches *
// micro_batch_size; rank r takes the contiguous slice [r*G/world_size, (r+1)*G/world_size) of them,
// cut into `micro_batches` micro-batches. So the ranks' slices are disjoint, their union is the
// global batch, and every rank computes it from (seed, step) alone: no communication.
//
// Documents: a window may hold the end of one document and the start of the next. A document ends
// at an EOD token (the data ends its documents with one) and where the dataset's document index
// says (TokenDataset::document_ends, a Megatron .idx's documents; the two agree for data written
// with an EOD per document). With `reset_at_documents` each row also carries its documents
// (segment ids, +1 after every document's last token, and each token's position inside its
// document), from which the model restricts attention to the token's own document (Megatron-LM's
// reset_attention_mask and reset_position_ids); the EOD belongs to the document it ends. With
// `mask_eod_loss` the target predicted from an EOD input (the next document's first token, which
// that position cannot see) is kIgnoreTarget (Megatron's eod_mask_loss).
//
// Sample orders (LoaderOptions::sample_order). kWindows: as above, the windows of the stream in
// file order, each epoch a permutation of them. kDocuments (Megatron's GPTDataset sample index):
// every epoch first shuffles the documents (seeded by seed and epoch), concatenates them into
// that epoch's stream, cuts it into W samples of S + 1 tokens exactly as windows are cut from the
// file's stream (sample i is stream tokens [i*S, i*S + S], so consecutive samples share one
// boundary token and the last (n - 1) mod S tokens of the epoch's stream go unused, different ones
// every epoch), and then permutes the epoch's samples as kWindows does. W and the global batch
// arithmetic are the same in both orders. The documents are the runs between the EOD tokens and
// the dataset's document_ends (the last one running to the end of the data); segments, positions
// and mask_eod_loss follow them in the reordered stream. Memory: the document ends, and per cached
// epoch a permutation of the documents and the prefix sums of their lengths, O(documents); the
// tokens are read from the dataset where they lie. With shuffle off the order is the file's
// (identity permutations), which is kWindows.
#ifndef ORTHOSHARD_DATA_LOADER_H_
#define ORTHOSHARD_DATA_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/dataset.h"

namespace orthoshard::data {

// How the samples of an epoch are chosen (see the file comment).
enum class SampleOrder {
  kWindows,    // windows of the file's stream, permuted per epoch
  kDocuments,  // documents shuffled per epoch, samples cut from that stream, then permuted
};

// "windows" / "documents".
absl::string_view SampleOrderName(SampleOrder order);

// The ends of `data`'s documents as SampleOrder::kDocuments cuts them (exclusive token offsets,
// increasing, the last = the token count): after every `eod` token (when eod >= 0; one scan of the
// tokens) and at every TokenDataset::document_ends entry. Errors: kInvalidArgument naming the
// dataset for fewer than two documents ("sample_order documents needs documents ...").
absl::StatusOr<std::vector<int64_t>> DocumentEnds(const TokenDataset& data, int64_t eod);

struct LoaderOptions {
  int64_t seq_len = 64;           // S: tokens per sample
  int64_t micro_batch_size = 8;   // samples per micro-batch on each rank
  int64_t micro_batches = 1;      // micro-batches per step on each rank (gradient accumulation)
  int rank = 0;                   // in [0, world_size)
  int world_size = 1;
  uint64_t seed = 0;              // permutation seed; must match on every rank
  bool shuffle = true;            // false: windows in order (eval)
  int64_t eod_token = -1;         // >= 0: every document ends with this id
  // MicroBatch::segments/positions, at EOD tokens and the dataset's document_ends (needs
  // eod_token >= 0 or more than one document end).
  bool reset_at_documents = false;
  bool mask_eod_loss = false;     // targets after an EOD input are kIgnoreTarget (needs eod_token)
  // kDocuments needs documents: an EOD token that occurs or a document index, two documents at
  // least.
  SampleOrder sample_order = SampleOrder::kWindows;
};

// A target that is not predicted (cross entropy's ignore_index, as PyTorch's and HF's -100).
inline constexpr int64_t kIgnoreTarget = -100;

// One micro-batch, row-major [rows, cols] int64 ids ready for at::from_blob.
struct MicroBatch {
  int64_t rows = 0;                 // micro_batch_size
  int64_t cols = 0;                 // seq_len
  std::vector<int64_t> inputs;      // [rows * cols]
  std::vector<int64_t> targets;     // [rows * cols], inputs shifted by one token
  std::vector<int64_t> sample_ids;  // [rows] global sample indices (step * G + j)
  // [rows] the sample's index in its epoch's stream: the dataset window (kWindows), or the
  // window of the epoch's shuffled-document stream (kDocuments)
  std::vector<int64_t> windows;
  // LoaderOptions::reset_at_documents: [rows * cols] document of each token within its row (0, 1, ...)
  // and its position inside that document; empty otherwise.
  std::vector<int64_t> segments;
  std::vector<int64_t> positions;
  bool has_boundaries = false;      // a row has a document end before its last token (else: plain
                                    // causal)
  int64_t counted_targets = 0;      // targets that are not kIgnoreTarget
};

// Where a loader stands, plus what must match for a resume to continue the same stream.
struct LoaderState {
  int64_t step = 0;          // next step to produce
  uint64_t seed = 0;
  int64_t seq_len = 0;
  int64_t global_batch = 0;  // G
  int64_t num_windows = 0;   // W, a fingerprint of the dataset size
  bool shuffle = true;
  // CRC-32C of the token count and of 64 blocks of 1024 tokens spread evenly over the data (first
  // and last included): another dataset of the same size is caught at resume without reading all
  // of it.
  uint32_t data_fingerprint = 0;
  // The whole data: CRC-32C of TokenDataset::file_crc32c and index_crc32c (every byte of the file
  // or files the tokens came from, read at load anyway). Absent for data without file CRCs (the
  // synthetic corpus, generated from the seed) and in states saved before it was recorded; it is
  // compared only when both the saved state and the loader have one.
  std::optional<uint32_t> content_crc32c;
  // kWindows in states saved before it was recorded.
  SampleOrder sample_order = SampleOrder::kWindows;

  // "loader v2 step=12 seed=7 seq_len=64 global_batch=16 num_windows=1000 shuffle=1
  // data=8c1d0a3f content=5e2b0c11 order=documents" (content= only when known, order= only for
  // kDocuments, so a kWindows state reads as before)
  std::string Serialize() const;
  // Errors: kInvalidArgument naming the field that is missing or malformed.
  static absl::StatusOr<LoaderState> Parse(absl::string_view text);
};

class DataLoader {
 public:
  // `data` is shared, not copied. Errors: kInvalidArgument for non-positive sizes, a rank outside
  // [0, world_size), reset_at_documents without an EOD token or a document index,
  // mask_eod_loss without an EOD token, a dataset too short for one window ("dataset 'x' has
  // 10 tokens, seq_len 64 needs at least 65"), or sample_order kDocuments on data of fewer than
  // two documents (kDocuments reads every token once here to find the EOD tokens).
  static absl::StatusOr<DataLoader> Create(std::shared_ptr<const TokenDataset> data,
                                           const LoaderOptions& options);

  // This rank's micro-batches of the next global batch; advances the position by one step.
  std::vector<MicroBatch> Next();

  // This rank's micro-batches of global batch `step`, without moving the position.
  std::vector<MicroBatch> BatchAt(int64_t step) const;

  // Targets that count (are not kIgnoreTarget) in global batch `step` over all ranks: what a
  // per-token mean loss of the step divides by. Every rank computes it alike, from the data alone
  // (rows * cols * G without mask_eod_loss).
  int64_t CountedTargets(int64_t step) const;

  LoaderState state() const;

  // Continues from `state`. Errors: kFailedPrecondition when seed, seq_len, global batch, window
  // count, shuffle, sample order, data fingerprint or content CRC differ from this loader's
  // ("loader resume: seq_len 32 in the saved state, 64 now"); kInvalidArgument for a negative
  // step.
  absl::Status Restore(const LoaderState& state);

  int64_t global_batch() const { return global_batch_; }
  int64_t num_windows() const { return num_windows_; }

 private:
  DataLoader(std::shared_ptr<const TokenDataset> data, const LoaderOptions& options);
  // Builds the cached permutations of `epoch` (samples; documents and their stream for
  // kDocuments) unless they are cached.
  void CacheEpoch(int64_t epoch) const;
  // The sample's window in its epoch's stream (MicroBatch::windows).
  int64_t WindowOf(int64_t global_sample) const;
  // Copies `count` <= S + 1 tokens of the sample from its start into out, and sets *ends to the
  // offsets e in (0, count] where a document of the epoch's stream ends at the sample's token e
  // (kDocuments; kWindows: the dataset's document_ends), ascending.
  void CopySample(int64_t global_sample, int64_t count, int64_t* out,
                  std::vector<int64_t>* ends) const;
  bool shuffled_documents() const {
    return options_.sample_order == SampleOrder::kDocuments && options_.shuffle;
  }

  std::shared_ptr<const TokenDataset> data_;
  LoaderOptions options_;
  int64_t global_batch_ = 0;
  int64_t num_windows_ = 0;
  uint32_t data_fingerprint_ = 0;
  std::optional<uint32_t> content_crc32c_;
  int64_t step_ = 0;
  // kDocuments: the token offset past each document's last token, ascending, no empty document,
  // the last tokens.size(). Empty for kWindows.
  std::vector<int64_t> document_ends_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> permutation_;  // of the cached epoch's samples
  // kDocuments, of the cached epoch: the documents in stream order (indices into
  // document_ends_), and the stream offset past each of them (prefix sums of their lengths).
  mutable std::vector<int64_t> document_order_;
  mutable std::vector<int64_t> stream_ends_;
};

}  // namespace orthoshard::data

#endif  // ORTHOSHARD_DATA_LOADER_H_
