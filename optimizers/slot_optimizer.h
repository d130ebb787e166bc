// The one kind of thing every optimizer here updates — a Slot: a param, or the part of one that
// this rank updates — and the base class of the two update rules, AdamW (adamw.h) and Muon
// (muon.h), over a list of slots.
//
// A single process gives every param as one slot that covers the whole tensor; a data-parallel
// rank gives what it owns: whole matrices for Muon (layer-wise ownership), element ranges of
// buckets for AdamW (ZeRO-1, where a param may straddle ranks); a replicated rank gives every param
// whole but saves only its share. The update rules cannot tell these apart, so single-process
// training is the dp = 1 case of the sharded one, and state is one format (state.h) in every mode.
//
// Mixed precision: a slot whose model param is bf16 gets an fp32 main param owned by the optimizer
// (state field "main_param"); the update runs on the main param and is then copied (rounded) into
// the model param. An fp32 model param is its own main param and is updated in place. Gradients
// may be fp32 or bf16; they are read as fp32 and never written.
//
// Gradients are tensor handles: a slot keeps the grad tensor it was created with and reads
// whatever is in it at Step (a grad buffer's view, or a tensor the caller writes into).
//
// Cross-rank use: nothing here communicates. GradSumSquares is this rank's partial sum, which a
// caller (ChainedOptimizer with a StatsReducer) combines across ranks before the clip and skip
// decision reaches Step as a StepContext, identically on every rank.
#ifndef ORTHOSHARD_OPTIMIZERS_SLOT_OPTIMIZER_H_
#define ORTHOSHARD_OPTIMIZERS_SLOT_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tp_split.h"
#include "optimizers/state.h"

namespace orthoshard::optimizers {

// How a fused 2-D weight splits into logical matrices, decided from its global shape. The weight
// [num_groups * sum(block_rows), cols] is viewed as [num_groups, sum(block_rows), cols]; block j of
// every group together forms one logical matrix [num_groups * block_rows[j], cols], as Megatron's
// split_qkv does with qkv_split_shapes = [heads / groups * head_dim, head_dim, head_dim]: the query
// heads of all groups form Q, the key heads K, the value heads V. The lr scale uses the block shape.
//   fused QKV with G query groups, h heads per group, head dim d: {G, {h * d, d, d}}
//   SwiGLU fc1 [2 * ffn, hidden] = [gate; up]:                  {1, {ffn, ffn}}
// An empty block_rows means "one matrix" (no split).
struct FusedSplit {
  int64_t num_groups = 1;
  std::vector<int64_t> block_rows;
};

// Checks `split` against a [rows, cols] weight. Errors: kInvalidArgument, e.g. "param 'qkv': fused
// split 2 groups x 48 rows = 96 rows, weight has 80".
absl::Status ValidateSplit(absl::string_view name, const FusedSplit& split, int64_t rows);

// A param, or the contiguous part of one that an optimizer updates.
struct Slot {
  std::string name;                 // the whole param's name; prefixes its state names
  std::vector<int64_t> full_shape;  // the whole param's shape ({} for a scalar)
  int64_t offset = 0;               // element offset of `param` in the flattened whole param
  at::Tensor param;  // model param part, fp32 or bf16, contiguous; the full shape when the slot
                     // covers the whole param, else 1-D. Updated in place by Step.
  at::Tensor grad;   // same shape, fp32 or bf16; read only. Undefined: not stepped
  // The elements [saved_begin, saved_end) of this slot are this rank's to save: all of them,
  // except where ranks that all hold the same slot share the saving (replicated training).
  int64_t saved_begin = 0;
  int64_t saved_end = 0;
  // Tensor parallelism: how the param is split over the tp group. full_shape (and `param`) are then
  // this tp rank's slice; TpGlobalShape(full_shape, tp) is the whole param's. Replicated by default.
  TpSplit tp;

  // A slot covering the whole of `param`, all of it saved.
  static Slot Whole(std::string name, at::Tensor param, at::Tensor grad);
  int64_t numel() const { return param.numel(); }
  bool covers_whole() const;
};

// Which elements a rank's gradient statistics count (GradSumSquares and its siblings).
struct StatsScope {
  // Only each slot's saved elements [saved_begin, saved_end): replicated ranks that split the
  // saving count every element once over all of them.
  bool saved_only = false;
  // None of a slot whose param is not split over tp (Slot::tp): under tensor parallelism every tp
  // rank holds the same such param and gradient, which one tp rank (rank 0) counts for all.
  bool skip_tp_replicated = false;
};

// What one Step applies on top of each slot's hyperparameters.
struct StepContext {
  double lr_multiplier = 1.0;  // schedule factor: the lr used is the slot's lr * lr_multiplier
  double grad_scale = 1.0;     // gradients are multiplied by this before use (clipping); 1 = as is
};

// An update rule over slots (AdamW, Muon). The shared part: gradient checks, fp32 main params,
// the squared gradient norm, and state export/import in the StateRecord format; a subclass adds
// its per-slot state and the update.
class SlotOptimizer {
 public:
  virtual ~SlotOptimizer() = default;
  SlotOptimizer(const SlotOptimizer&) = delete;
  SlotOptimizer& operator=(const SlotOptimizer&) = delete;

  // "adamw" or "muon".
  virtual absl::string_view kind() const = 0;

  // Updates every slot that has a gradient. Errors: kInvalidArgument when a gradient's shape or
  // dtype no longer matches its param (nothing is updated then); kInternal for a LibTorch failure.
  absl::Status Step(const StepContext& context);
  // Updates the slots `indices` (into slot(i)) that have a gradient, in that order. Errors: as
  // Step, for those slots; kInvalidArgument for an index out of range.
  absl::Status Step(const StepContext& context, absl::Span<const int64_t> indices);

  // Sum over this optimizer's gradients of ||g||^2 (each norm in fp32, summed in double, in slot
  // order). Not finite when a gradient holds inf/NaN (or the sum overflows). Over the elements
  // `scope` counts (every element of every slot by default). Error: kInternal.
  absl::StatusOr<double> GradSumSquares(const StatsScope& scope = {}) const;
  // Sum over this optimizer's fp32 main params of ||p||^2 (as GradSumSquares). Error: kInternal.
  absl::StatusOr<double> ParamSumSquares(const StatsScope& scope = {}) const;
  // Elements of this optimizer's gradients that are exactly zero (as GradSumSquares). Error:
  // kInternal.
  absl::StatusOr<int64_t> GradZeros(const StatsScope& scope = {}) const;

  // Appends the records this rank saves: per slot "<name>/<field>" for every state tensor (the
  // saved elements, at their offset in the whole param), each counter field as an int64 scalar
  // (when anything of the slot is saved), and "<name>/main_param" for bf16 params. A param of no
  // elements (shape [0, 7]) is exported whole: empty tensors and its counters, so that
  // ImportState of the export finds every field.
  void ExportState(std::vector<StateRecord>& out) const;

  // Fills every slot's state from `state` (ReadStateRange over the slot's elements), then copies
  // main params into bf16 model params. With `validate_only` nothing is changed. Errors: as
  // ReadStateRange / ReadStateCounter.
  absl::Status ImportState(absl::Span<const StateRecord> state, bool validate_only = false);

  // Row scaling for the next step (QK-clip, Kimi K2's MuonClip: after the update, the query and
  // key rows of an attention head whose logits grew too large are scaled down). Row r of param
  // `name` is multiplied by row_scales[r] by the next Step that updates a slot of `name`: after
  // the update of its fp32 main param and before that is copied (rounded) into a bf16 model
  // param, so what the caller then syncs is the scaled param. A slot holding a part of its param
  // (ZeRO-1: elements [offset, offset + numel) of the flattened matrix) scales the rows those
  // elements fall in. Stepping a slot consumes its scales; ClearRowScales drops all pending ones.
  // row_scales: a 1-D floating tensor of full_shape[0] elements, any device. Returns whether this
  // optimizer holds a slot of `name` (nothing to do otherwise). Errors: kInvalidArgument for a
  // param that is not 2-D or row scales of another length, naming both.
  absl::StatusOr<bool> SetRowScales(absl::string_view name, const at::Tensor& row_scales);
  void ClearRowScales();

  // The state fields of one slot of this rule, e.g. {"exp_avg", "exp_avg_sq", "step"}
  // ("main_param" is every rule's, for bf16 params).
  virtual std::vector<std::string> FieldNames() const = 0;

  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  int64_t numel() const;
  // Bytes of optimizer state this rank holds: every state tensor of every slot plus the fp32
  // main params it owns (an fp32 param is its own main param and costs nothing extra).
  // `include` (may be empty: every slot) picks the slots counted by their param's name.
  int64_t state_bytes(const std::function<bool(absl::string_view name)>& include = {}) const;
  const Slot& slot(int64_t i) const { return slots_[i].slot; }

 protected:
  // A slot as the optimizer holds it.
  struct Held {
    Slot slot;
    at::Tensor main;  // fp32; aliases slot.param when that is fp32
    // Pending SetRowScales factors, fp32 on main's device, broadcastable to main ([rows, 1] for a
    // whole matrix, one per element for a part); undefined when none.
    at::Tensor row_factors;
    bool owns_main() const { return !main.is_same(slot.param); }
  };
  // A tensor field of a slot's state (same shape as the slot's param, fp32) or an int64 counter.
  struct Field {
    std::string name;
    at::Tensor tensor;  // undefined for a counter
    int64_t counter = 0;
  };

  SlotOptimizer() = default;
  // Checks `slot` (name, contiguous fp32/bf16 param, a matching grad, a part of its full shape,
  // a saved range inside it) and holds it with its main param. Errors: kInvalidArgument naming it.
  absl::Status Add(Slot slot);

  // The update of slot `i` with its fp32 (scaled) gradient and the schedule's multiplier.
  virtual void Update(size_t i, const at::Tensor& grad, double lr_multiplier) = 0;
  // Updates the slots `indices` (checked, each with a gradient) and calls FinishUpdate for each.
  // The default updates them one at a time with Update; a rule that computes across slots (Muon's
  // batched Newton–Schulz, its tensor-parallel exchange) overrides it. Errors: the override's
  // (a failed collective); the slots' updates may then be partial (callers treat it as fatal).
  virtual absl::Status UpdateSlots(absl::Span<const int64_t> indices, const StepContext& context);
  // After slot `i`'s update: applies its pending row scales to the main param, then copies an
  // owned main param into its model param. Every UpdateSlots calls it for each slot it updates.
  void FinishUpdate(size_t i);
  // The fp32 gradient of slot `i`, scaled by `grad_scale` (a fresh tensor unless no scaling or
  // cast was needed).
  at::Tensor ScaledGrad(size_t i, double grad_scale) const;
  // The state of slot `i`, in FieldNames() order without "main_param". Tensors are the live
  // state (import copies into them); counters are values, restored through SetCounter.
  virtual std::vector<Field> Fields(size_t i) const = 0;
  virtual void SetCounter(size_t i, absl::string_view field, int64_t value) = 0;

  std::vector<Held> slots_;
};

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_SLOT_OPTIMIZER_H_
