// Distributed optimizers over ParamAndGradBuffers: each data-parallel rank updates only what the
// layout says it owns, then every rank gets the updated params back by an all-gather of each
// bucket straight into `param_data`.
//
//   LayerWiseDistributedOptimizer  Muon on whole matrices. The buffer's layout must be shard-aligned
//                                  (layerwise or megatron_lpt): a rank owns the params of its shard
//                                  (PerBufferParamLayout::OwnerOf) and keeps fp32 main params and
//                                  momentum for those only. Ranks that own no matrix are idle.
//   DistributedOptimizer           ZeRO-1, element-level AdamW: a rank updates the range
//                                  ShardRange(bucket, rank) of every bucket, params straddling a
//                                  shard boundary included (fp32 main-param slice and moments for
//                                  just that slice; AdamW is elementwise, so slices are exact).
//   DistributedChainedOptimizer    routes params like optimizers::ChainedOptimizer, owns both of the
//                                  above (mode kSharded) or a plain ChainedOptimizer over the whole
//                                  buffers (mode kReplicated, the baseline), does the ONE all-reduce
//                                  of global statistics, and the skip / clip / schedule decisions.
//
// Gradient contract. Before Step, grad_data must hold the data-parallel MEAN of the gradients:
//   kSharded:    at least this rank's shard of every bucket (the reduce-scatter grad sync of
//                buffers/bucket_sync.h, as ddp/ runs it);
//   kReplicated: the whole buffer (the all-reduce grad sync).
//
// Param sync. After a sharded Step, only this rank's shards of param_data are new. Either call
// LaunchParamSync() + WaitParamSync() (or StepAndSync(), which does all three), or, when a DDP with
// overlap_param_gather owns the all-gathers (it gathers bucket group g just before the first layer
// that needs it runs forward), call Step() only and let DDP launch and wait: the collective is the
// same (every bucket's shard `rank` of param_data gathered into the bucket, in place).
//
// Global statistics, per step, ONE all-reduce (sum, fp64) of [AdamW sum of squares, Muon sum of
// squares, number of ranks with a non-finite gradient]. Every rank then takes the same decisions:
// skip the step (nothing changes, not even step counters or the schedule position) when any
// gradient anywhere is not finite; clip by the global norm (ClipMode as in chained.h). Zero counts
// are not tracked.
//
// State in model space (for checkpoints, and for resuming at a different data-parallel size):
// ExportState returns ShardedTensor records named "<param>/<field>" (fields as in adamw.h and
// muon.h: exp_avg, exp_avg_sq, step, momentum_buffer, main_param) plus "chained/step" and
// "chained/skipped_steps". Each record is the part this rank owns, flattened, with its element
// offset in the whole tensor (kReplicated, where every rank holds everything: the elements its
// shards of the buffers cover); concatenating every rank's records describes the whole state.
// ImportState takes any such collection (e.g. every rank's export of a run at another dp) and
// picks out what this rank now owns.
#ifndef ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_DISTRIBUTED_OPTIMIZER_H_
#define ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_DISTRIBUTED_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "buffers/bucket_sync.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "optimizers/adamw.h"
#include "optimizers/chained.h"
#include "optimizers/muon.h"
#include "optimizers/optimizer.h"

namespace orthoshard::optimizers::distributed {

// A piece of one model-space state tensor.
struct ShardedTensor {
  std::string name;                 // "<param>/<field>" or "chained/<counter>"
  std::vector<int64_t> full_shape;  // shape of the whole tensor ({} for a scalar)
  int64_t offset = 0;               // element offset of `tensor` in the flattened whole tensor
  at::Tensor tensor;                // 1-D contiguous (a scalar for counters), an owned clone
};

// Reassembles whole tensors from pieces (every rank's export). Errors: kInvalidArgument when two
// pieces of one name disagree on the full shape or dtype, or a piece falls outside it; kNotFound
// "state tensor 'w/exp_avg' covers 12 of 40 elements" when pieces leave a gap.
absl::StatusOr<std::vector<NamedTensor>> AssembleModelSpace(absl::Span<const ShardedTensor> pieces);

// Every rank's copy of one param in one buffer: layout().params[index] of *buffer.
struct BufferParamRef {
  buffers::ParamAndGradBuffer* buffer = nullptr;
  int index = 0;
};

struct LayerWiseParam {
  BufferParamRef ref;
  MuonHyper hp;
  FusedSplit split;
};

struct DistOptParam {
  BufferParamRef ref;
  AdamWHyper hp;
};

// Muon on the whole matrices this rank owns.
class LayerWiseDistributedOptimizer {
 public:
  // Errors: kInvalidArgument when a buffer's dp differs from comm.size(), a param straddles a shard
  // (layout not shard-aligned; names the param and the strategy), is not 2-D, has an invalid split
  // or hyperparameters, or appears twice; or as MakeMainParam.
  static absl::StatusOr<std::unique_ptr<LayerWiseDistributedOptimizer>> Create(
      std::vector<LayerWiseParam> params, int rank, int dp);

  // Partial sum of ||g||^2 over the matrices this rank owns. Error: kInternal (LibTorch).
  absl::StatusOr<double> LocalGradSumSquares() const;
  // Updates the owned matrices and writes them into param_data. Errors: as Optimizer::Step.
  absl::Status Step(const StepContext& context);
  std::vector<ShardedTensor> ExportState() const;
  // Picks this rank's part out of `state`. Validates everything before copying; with
  // `validate_only` copies nothing. Errors: kNotFound / kInvalidArgument as AssembleModelSpace, or
  // kNotFound for a missing field.
  absl::Status ImportState(absl::Span<const ShardedTensor> state, bool validate_only = false);
  // Names of the params this rank owns, in creation order.
  std::vector<std::string> OwnedParams() const;

 private:
  struct Slot {
    MainParam p;
    MuonHyper hp;
    at::Tensor momentum_buffer;
  };
  explicit LayerWiseDistributedOptimizer(std::vector<Slot> slots) : slots_(std::move(slots)) {}
  std::vector<Slot> slots_;
};

// ZeRO-1 AdamW over element ranges.
class DistributedOptimizer {
 public:
  // Errors: kInvalidArgument when a buffer's dp differs from comm dp, hyperparameters are invalid
  // or a param appears twice; or as MakeMainParam.
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      std::vector<DistOptParam> params, int rank, int dp);

  absl::StatusOr<double> LocalGradSumSquares() const;
  absl::Status Step(const StepContext& context);
  std::vector<ShardedTensor> ExportState() const;
  // As LayerWiseDistributedOptimizer::ImportState.
  absl::Status ImportState(absl::Span<const ShardedTensor> state, bool validate_only = false);
  // Elements of params (not padding) this rank updates.
  int64_t owned_numel() const;

 private:
  struct Slot {
    MainParam p;                      // param/grad: 1-D views of this rank's slice
    std::vector<int64_t> full_shape;  // the whole param's shape
    int64_t offset = 0;               // slice offset in the flattened param
    AdamWHyper hp;
    AdamWState state;
  };
  explicit DistributedOptimizer(std::vector<Slot> slots) : slots_(std::move(slots)) {}
  std::vector<Slot> slots_;
};

enum class DistributedMode {
  kSharded,     // layer-wise Muon + ZeRO-1 AdamW; grads reduce-scattered, params all-gathered
  kReplicated,  // grads all-reduced, every rank steps every param (baseline)
};

class DistributedChainedOptimizer {
 public:
  // Routes every param of `buffers` with config.routing (shapes from the model params), builds the
  // optimizers this rank needs, and keeps `comm` (which must outlive this object). In kSharded
  // mode Muon-routed params must sit in shard-aligned buffers; AdamW-routed params may sit in any.
  // Errors: kInvalidArgument from routing, the schedule, hyperparameters, a buffer whose dp is not
  // comm.size(), or a Muon param straddling shards ("param 'w' is routed to muon but straddles a
  // shard boundary of a distopt buffer; Muon needs whole matrices (use a shard-aligned layout)").
  // `splits` maps a param name to its FusedSplit (fused QKV, SwiGLU fc1): Muon orthogonalises each
  // logical block separately, in both modes, exactly as ChainedOptimizer does with Param::split;
  // params not in the map are one matrix, and splits of AdamW-routed params are ignored (as in
  // ChainedOptimizer). Further errors (kInvalidArgument): a split naming no param of `buffers`
  // ("fused split given for unknown param 'x'"), or one that does not fit its Muon param
  // (ValidateSplit's message).
  static absl::StatusOr<std::unique_ptr<DistributedChainedOptimizer>> Create(
      std::vector<buffers::ParamAndGradBuffer*> buffers, collectives::Communicator* comm,
      ChainedConfig config, DistributedMode mode,
      const std::map<std::string, FusedSplit>& splits = {});

  // One step (see the file comment for the gradient contract). kSharded: one all-reduce of the
  // statistics, then both optimizers; params are NOT yet synced. Errors: those of the collective
  // (the job must stop), or as Optimizer::Step.
  absl::StatusOr<StepResult> Step();
  // All-gathers every bucket of every buffer into param_data (no-op in kReplicated). Every rank
  // must call it after every Step, skipped or not.
  absl::Status LaunchParamSync();
  absl::Status WaitParamSync();
  // Step, LaunchParamSync, WaitParamSync.
  absl::StatusOr<StepResult> StepAndSync();

  std::vector<ShardedTensor> ExportState() const;
  // Records of other names (e.g. model params stored alongside) are ignored. Errors: as
  // AssembleModelSpace; kNotFound for a missing field or counter; kInvalidArgument for a field a
  // param of ours does not have (kReplicated) or a shape/dtype mismatch.
  absl::Status ImportState(absl::Span<const ShardedTensor> state);

  const RoutingReport& routing_report() const { return report_; }
  DistributedMode mode() const { return mode_; }
  int64_t steps_taken() const;
  int64_t skipped_steps() const;
  // Muon params this rank owns (kSharded; every Muon param in kReplicated).
  std::vector<std::string> OwnedMuonParams() const;

 private:
  DistributedChainedOptimizer() = default;

  std::vector<buffers::ParamAndGradBuffer*> buffers_;
  collectives::Communicator* comm_ = nullptr;
  ChainedConfig config_;
  DistributedMode mode_ = DistributedMode::kSharded;
  RoutingReport report_;
  std::unique_ptr<LayerWiseDistributedOptimizer> layerwise_;  // kSharded
  std::unique_ptr<DistributedOptimizer> distopt_;             // kSharded
  std::unique_ptr<ChainedOptimizer> replicated_;              // kReplicated
  std::vector<std::unique_ptr<collectives::Work>> pending_sync_;
  int64_t steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace orthoshard::optimizers::distributed

#endif  // ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_DISTRIBUTED_OPTIMIZER_H_
