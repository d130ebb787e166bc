// The one format of optimizer state, in model space, for every mode and every checkpoint.
//
// A StateRecord is a piece of one state tensor of the model: "<param>/<field>" (exp_avg,
// exp_avg_sq, step, momentum_buffer, main_param) or "chained/<counter>", with the whole tensor's
// shape and the element offset of the piece in it. A single process exports whole tensors (offset
// 0); a data-parallel rank exports the pieces it owns; the records of all ranks together describe
// the state once. Import takes any such collection (every rank's export of a run at another
// data-parallel size, say) and picks out the elements it needs, so resuming at another size or
// layout needs no conversion.
//
// OptimizerState is all that checkpoint/ sees of an optimizer.
#ifndef ORTHOSHARD_OPTIMIZERS_STATE_H_
#define ORTHOSHARD_OPTIMIZERS_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace orthoshard::optimizers {

// A piece of one model-space state tensor.
struct StateRecord {
  std::string name;                 // "<param>/<field>" or "chained/<counter>"
  std::vector<int64_t> full_shape;  // shape of the whole tensor ({} for a scalar)
  int64_t offset = 0;               // element offset of `tensor` in the flattened whole tensor
  at::Tensor tensor;                // 1-D contiguous (an int64 scalar for counters), owned
};

// What checkpoint/ needs of an optimizer: its state out and back in.
class OptimizerState {
 public:
  virtual ~OptimizerState() = default;

  // The pieces of state this rank is responsible for saving (clones, safe to keep).
  virtual std::vector<StateRecord> ExportState() const = 0;

  // Restores what this rank needs from `state` (any collection of records, e.g. every rank's
  // export). Validates everything before changing anything. Errors: kNotFound for a missing
  // record or one that leaves a gap ("state tensor 'w/exp_avg' covers 12 of 40 elements ...");
  // kInvalidArgument for a record of an unknown param or field, or a shape/dtype mismatch.
  virtual absl::Status ImportState(absl::Span<const StateRecord> state) = 0;
};

// Shape as "[2,3]" for messages.
std::string ShapeString(at::IntArrayRef shape);

// The elements [offset, offset + numel) of the whole tensor `name` (of `full_shape` and `dtype`)
// assembled from `pieces`, as a new 1-D tensor. Pieces may overlap (equal ranks' copies) and come
// in any order. Errors: kNotFound "missing state tensor 'w/exp_avg'" when no piece has the name, or
// "state tensor 'w/exp_avg' covers 12 of 40 elements needed at offset 8" when they leave a gap;
// kInvalidArgument when a piece's full shape or dtype differs or it falls outside the tensor.
absl::StatusOr<at::Tensor> ReadStateRange(absl::Span<const StateRecord> pieces,
                                          const std::string& name,
                                          at::IntArrayRef full_shape, int64_t offset,
                                          int64_t numel, at::ScalarType dtype);

// The int64 counter `name`. Errors: kNotFound if absent; kInvalidArgument if not an int64 scalar.
absl::StatusOr<int64_t> ReadStateCounter(absl::Span<const StateRecord> pieces,
                                         const std::string& name);

// An int64 scalar counter record.
StateRecord CounterRecord(std::string name, int64_t value);

// Reassembles whole tensors from pieces, one record per name (offset 0, the full shape's view).
// Errors: as ReadStateRange over the whole tensor.
absl::StatusOr<std::vector<StateRecord>> AssembleModelSpace(absl::Span<const StateRecord> pieces);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_STATE_H_
