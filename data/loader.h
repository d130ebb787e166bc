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
  std::vector<int64_t> windows;     // [rows] dataset window of each row
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

  // "loader v2 step=12 seed=7 seq_len=64 global_batch=16 num_windows=1000 shuffle=1
  // data=8c1d0a3f content=5e2b0c11" (content= only when known)
  std::string Serialize() const;
  // Errors: kInvalidArgument naming the field that is missing or malformed.
  static absl::StatusOr<LoaderState> Parse(absl::string_view text);
};

class DataLoader {
 public:
  // `data` is shared, not copied. Errors: kInvalidArgument for non-positive sizes, a rank outside
  // [0, world_size), reset_at_documents without an EOD token or a document index,
  // mask_eod_loss without an EOD token, or a dataset too short for one window ("dataset 'x' has
  // 10 tokens, seq_len 64 needs at least 65").
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
  // count, shuffle, data fingerprint or content CRC differ from this loader's ("loader resume:
  // seq_len 32 in the saved state, 64 now"); kInvalidArgument for a negative step.
  absl::Status Restore(const LoaderState& state);

  int64_t global_batch() const { return global_batch_; }
  int64_t num_windows() const { return num_windows_; }

 private:
  DataLoader(std::shared_ptr<const TokenDataset> data, const LoaderOptions& options);
  int64_t WindowOf(int64_t global_sample) const;

  std::shared_ptr<const TokenDataset> data_;
  LoaderOptions options_;
  int64_t global_batch_ = 0;
  int64_t num_windows_ = 0;
  uint32_t data_fingerprint_ = 0;
  std::optional<uint32_t> content_crc32c_;
  int64_t step_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> permutation_;  // of the cached epoch
};

}  // namespace orthoshard::data

#endif  // ORTHOSHARD_DATA_LOADER_H_
