// The Optimizer interface and the types every optimizer shares: a named parameter with its gradient,
// per-step context (schedule multiplier, clipping scale), named state tensors for checkpoints, and the
// per-tensor helpers (fp32 main params, gradient read in fp32, local squared gradient norm) that the
// single-process optimizers here and the distributed ones in optimizers/distributed/ both use.
//
// Mixed precision: a param whose model tensor is bf16 gets an fp32 main param owned by the optimizer
// (exported as "<name>/main_param"); the update runs on the main param and is then copied (rounded)
// into the model tensor. An fp32 model param is its own main param and is updated in place.
// Gradients may be fp32 or bf16; they are read as fp32 and never written.
//
// Cross-rank use: nothing here communicates. LocalGradSumSquares returns a partial sum that a caller
// may all-reduce before deciding on clipping or skipping; the decision then reaches Step as a
// StepContext, identically on every rank.
#ifndef ORTHOSHARD_OPTIMIZERS_OPTIMIZER_H_
#define ORTHOSHARD_OPTIMIZERS_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

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

// One parameter handed to an optimizer.
struct Param {
  std::string name;   // unique within an optimizer; prefixes its state names
  at::Tensor param;   // model param, fp32 or bf16, contiguous; updated in place by Step
  at::Tensor grad;    // same shape, fp32 or bf16; read only. Undefined: the param is not stepped
  FusedSplit split;   // Muon only: logical blocks of a fused weight
};

// A tensor of optimizer state under a stable name, for checkpoints.
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// What one Step applies on top of each group's hyperparameters.
struct StepContext {
  double lr_multiplier = 1.0;  // schedule factor: the lr used is group lr * lr_multiplier
  double grad_scale = 1.0;     // gradients are multiplied by this before use (clipping); 1 = as is
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // "adamw" or "muon".
  virtual absl::string_view kind() const = 0;

  // Updates every param that has a gradient. Errors: kInvalidArgument when a gradient's shape or
  // dtype no longer matches its param (nothing is updated then); kInternal for a LibTorch failure.
  virtual absl::Status Step(const StepContext& context) = 0;

  // Sum over all gradients of ||g||^2 (each norm in fp32, summed in double). Not finite when any
  // gradient holds inf/NaN (or the sum overflows). Error: kInternal for a LibTorch failure.
  virtual absl::StatusOr<double> GradSumSquares() const = 0;

  // State tensors named "<param name>/<field>" (clones, safe to keep). Fields: see each optimizer.
  virtual std::vector<NamedTensor> ExportState() const = 0;

  // Restores state exported by an optimizer over the same params. Validates everything before
  // copying anything. Errors: kNotFound "missing state tensor 'w/exp_avg'"; kInvalidArgument for an
  // unexpected name or a shape/dtype mismatch (expected vs received).
  virtual absl::Status ImportState(absl::Span<const NamedTensor> state) = 0;

  // Replaces the gradient of param `name` (e.g. a fresh gradient buffer). Gradients held are tensor
  // handles, so in-place writes into the tensor passed at construction are seen without this.
  // Errors: kNotFound "no param named 'x'"; kInvalidArgument as CheckGrad.
  virtual absl::Status SetGrad(const std::string& name, const at::Tensor& grad) = 0;

  // Params and their total element count, for routing reports.
  virtual int64_t num_params() const = 0;
  virtual int64_t numel() const = 0;
};

// ---- helpers shared with optimizers/distributed/ ----

// A param as an optimizer holds it: the model tensor and the fp32 main param it updates.
struct MainParam {
  Param param;
  at::Tensor main;  // fp32; aliases param.param when that is fp32
  bool owns_main() const { return !main.is_same(param.param); }
};

// Checks `p` (name set, param defined, contiguous fp32/bf16, grad undefined or same shape and
// fp32/bf16) and creates its main param. Errors: kInvalidArgument naming the param.
absl::StatusOr<MainParam> MakeMainParam(Param p);

// Checks that `p.grad` still matches its param (run before any update). Errors as MakeMainParam.
absl::Status CheckGrad(const Param& p);

// The gradient as fp32, multiplied by `scale` when scale != 1 (a new tensor then; otherwise an fp32
// gradient is returned as is, so an unscaled step is bitwise PyTorch's).
at::Tensor GradAsFloat(const at::Tensor& grad, double scale);

// Copies the main param into a bf16 model param (no-op when they alias).
void SyncModelParam(const MainParam& p);

// Local partial sum of ||g||^2 over `params` with a gradient. Error: kInternal on LibTorch failure.
absl::StatusOr<double> LocalGradSumSquares(absl::Span<const MainParam> params);

// Shape as "[2,3]" for messages.
std::string ShapeString(at::IntArrayRef shape);

// Import helper: finds `name` in `state`, checks shape and dtype against `like`. Errors as
// Optimizer::ImportState.
absl::StatusOr<at::Tensor> FindState(absl::Span<const NamedTensor> state, const std::string& name,
                                     const at::Tensor& like);

// Import helper: every name in `state` must be in `expected`. Error: kInvalidArgument
// "unexpected state tensor 'x'".
absl::Status CheckNoUnexpectedState(absl::Span<const NamedTensor> state,
                                    const std::vector<std::string>& expected);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_OPTIMIZER_H_
