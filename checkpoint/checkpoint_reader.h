// Read side of a committed checkpoint: its manifest plus every shard file opened and cross-checked,
// with records looked up by (parameter name, kind) in model space.
//
// Open fails before anything is read if the manifest is missing, has an unknown format version, or
// any shard file is missing, truncated or disagrees with the manifest, so a loader built on it can
// check everything first and load nothing half-way. Read then checks the caller's expected dtype
// and shape and the record's CRC-32C. A loader on any data-parallel size reads just the records it
// now owns. A param saved as tensor-parallel slices (checkpoint/tp_slices.h) reads as its whole
// tensor (kind "param"), assembled from the slices; Open checks that every slice is there.
#ifndef ORTHOSHARD_CHECKPOINT_CHECKPOINT_READER_H_
#define ORTHOSHARD_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/manifest.pb.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tp_slices.h"

namespace orthoshard::checkpoint {

class CheckpointReader {
 public:
  // Opens the checkpoint at `path`: a step directory, or a root whose `latest` is followed.
  // Errors: those of ResolveCheckpointDir and ReadManifest (kFailedPrecondition for an unknown
  // format version); kDataLoss "checkpoint file <path> (holding tensor '<name>' (<kind>) and N more):
  // <reason>" for a shard file that is missing or not a valid safetensors file; those of
  // CheckRecordAgainstHeader for a header that disagrees with the manifest; those of WholeParams
  // (kDataLoss naming a param whose tp slice is missing or whose records disagree).
  static absl::StatusOr<CheckpointReader> Open(const std::string& path);

  // The resolved step directory.
  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }

  // The record (name, kind), or nullptr.
  const TensorRecord* Find(absl::string_view name, absl::string_view kind) const;
  // Every record of parameter `name` (the param and its optimizer state), in manifest order.
  std::vector<const TensorRecord*> RecordsOf(absl::string_view name) const;
  // Every param as a whole tensor (its record, or its tp slices), in manifest order; and one by
  // name, or nullptr.
  const std::vector<WholeParam>& params() const { return params_; }
  const WholeParam* FindParam(absl::string_view name) const;

  // Reads record (name, kind) into `out` after checking it has `expected_dtype` and
  // `expected_shape` (the caller's model), and checks its CRC-32C. Errors: kNotFound "checkpoint
  // <dir>: no record '<name>' (<kind>)"; kFailedPrecondition "checkpoint file <path>: tensor
  // '<name>' (<kind>) is F32 [2,3], the model expects F32 [3,2]"; those of ReadRecord (kDataLoss
  // for corrupted bytes, kInvalidArgument for a wrong `out` size). Thread-safe (pread only).
  // Kind "param" of a param saved as tp slices reads the whole tensor (expected_shape is the
  // whole shape), every slice CRC-checked.
  absl::Status Read(absl::string_view name, absl::string_view kind,
                    absl::string_view expected_dtype, absl::Span<const int64_t> expected_shape,
                    absl::Span<uint8_t> out) const;

 private:
  CheckpointReader() = default;
  std::string dir_;
  Manifest manifest_;
  std::map<std::string, SafetensorsReader> files_;  // shard file name → reader
  absl::flat_hash_map<std::pair<std::string, std::string>, int> index_;  // (name, kind) → record
  std::vector<WholeParam> params_;                   // point into manifest_'s records
  absl::flat_hash_map<std::string, int> param_index_;  // name → params_ index
};

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_CHECKPOINT_READER_H_
