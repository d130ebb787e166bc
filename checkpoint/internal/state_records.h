// The read side of LoadDistributedCheckpoint (not API): a checkpoint's params and optimizer state
// records turned into this rank's local tensors, at any tensor and data parallelism, plus the
// dtype and record-name conventions the save side shares.
//
// Optimizer state is saved as pieces (kind "state@<offset>.rank<r>") of model-space state
// tensors "<param>/<field>" whose shape is the metadata's "full_shape/<name>"; with tensor
// parallelism the elementwise state of a split param is a piece of a tp rank's local tensor and
// carries the record's TpSlice (checkpoint/tp_slices.h).
#ifndef ORTHOSHARD_CHECKPOINT_INTERNAL_STATE_RECORDS_H_
#define ORTHOSHARD_CHECKPOINT_INTERNAL_STATE_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/checkpoint_reader.h"
#include "common/tp_split.h"
#include "optimizers/state.h"

namespace orthoshard::checkpoint::internal_checkpoint {

inline constexpr char kStatePrefix[] = "state@";
inline constexpr char kFullShapePrefix[] = "full_shape/";

// safetensors dtype name of a LibTorch dtype, and back. Errors: kInvalidArgument for a dtype that
// cannot be checkpointed; kDataLoss for a name that is no supported state dtype.
absl::StatusOr<std::string> DTypeOf(at::ScalarType t);
absl::StatusOr<at::ScalarType> ScalarTypeOf(const std::string& dtype);

// The bytes of a contiguous CPU tensor.
absl::Span<const uint8_t> BytesOf(const at::Tensor& t);
absl::Span<uint8_t> MutableBytesOf(at::Tensor& t);

// Model-space name of the param a state tensor belongs to ("" for "chained/..." counters).
std::string StateParam(const std::string& state_name);

// "48,16" -> {48, 16} ("" -> {}). Errors: kDataLoss for anything else.
absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& s);

// Reads into `out` (this run's local tensor of param `name`, held as `split`, of dtype `dtype`)
// the elements it holds, from the saved records (the whole param, or its tp slices) that overlap
// it. Errors: kNotFound "checkpoint <dir>: no record '<name>' (param)"; kFailedPrecondition
// "checkpoint <dir>: param '<name>' is F32 [16,8], the model expects F32 [16,12] whole (this
// rank's slice ...)" for another dtype or whole shape; those of CheckpointReader::Read.
absl::Status ReadParamSlice(const CheckpointReader& reader, const std::string& name,
                            const std::string& dtype, const TpSplit& split, at::Tensor& out);

// A param this rank holds: this run's split (replicated when not split) and its local shape.
struct HeldParam {
  TpSplit split;
  std::vector<int64_t> local;
};

// Appends every optimizer state record of `reader` to `state`, except those of saved params not in
// `held` (experts of other ep ranks): ImportState picks out what this rank's slots need, and names
// anything that is no param of the checkpoint. The elementwise state of a param split over tp when
// saved or now is appended as one record of this rank's whole local tensor, assembled from the
// pieces of the saving tp ranks whose slices overlap it (only those are read). Errors: kDataLoss
// for a malformed state record; kFailedPrecondition when a state tensor's whole shape is not the
// model param's; kNotFound "checkpoint <dir>: state tensor '<name>': its saved tp slices hold N of
// the M elements this rank (tp ...) needs" for a missing slice; those of ReadStateRange and
// CheckpointReader::Read.
absl::Status ReadState(const CheckpointReader& reader,
                       const absl::flat_hash_map<std::string, HeldParam>& held,
                       std::vector<optimizers::StateRecord>& state);

}  // namespace orthoshard::checkpoint::internal_checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_INTERNAL_STATE_RECORDS_H_
