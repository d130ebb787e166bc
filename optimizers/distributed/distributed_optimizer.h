// The ChainedOptimizer of a data-parallel rank, built from the layout over DDP's buffers: which
// slots this rank updates, and the all-reduce of the step's gradient statistics.
//
//   kSharded     Muon-routed params (ParamPlacement::role) as whole matrices on the rank whose
//   shard
//                holds them (PerBufferParamLayout::OwnerOf: layer-wise ownership, fp32 main params
//                and momentum for those only; a rank that owns no matrix is idle); AdamW-routed
//                params as this rank's element range ShardRange(bucket, rank) of every bucket
//                (ZeRO-1; a param straddling shards contributes a slice). Statistics: one
//                all-reduce per step. Every slot is a view of this rank's shards
//                (ParamShard/GradShard), so the buffers' residency does not matter: with kFull
//                they lie inside the whole buffer, with kSharded (ZeRO-3) in the persistent shard
//                storage that is all the rank keeps.
//   kReplicated  every param whole on every rank (the baseline). Every rank holds the same
//                gradients, so no statistics all-reduce; each rank saves only the elements its
//                shards of the buffers cover, so the ranks' exports describe the state once.
//
// Gradient contract. Before Step, grad_data must hold the data-parallel MEAN of the gradients:
// kSharded: at least this rank's shard of every bucket (the reduce-scatter grad sync of
// buffers/bucket_sync.h, as ddp/ runs it); kReplicated: the whole buffer (the all-reduce grad
// sync).
//
// Param sync. After a kSharded Step only this rank's shards of param_data are new; the param sync
// gathers them, and every rank must run it after every Step, skipped or not. Given the buffers'
// bucket groups (buffers::BucketGroupSync, e.g. DDP's bucket_groups()), the optimizer's Step runs
// it itself, through a StepSync (optimizers/chained.h): BeginParamSync before writing any shard;
// with overlap_param_gather the update is staged in param gather order (one stage per bucket
// group, ParamSyncStage) and each group's all-gather starts (ParamSyncStageDone) as soon as this
// rank's part of it is written, hidden behind the update of the next groups; StartParamSync at the
// end of every step, skipped ones included (the rest of the all-gathers, waited on by the next
// forward's hooks, or all of them waited on without overlap; kSharded residency releases). Without
// them the caller runs the param sync (buffers::LaunchParamSync, or the bucket groups'
// BeginParamSync / StartParamSync around Step).
//
// State: the StateRecord format (optimizers/state.h) in model space, so a checkpoint resumes at
// any data-parallel size and in either mode.
#ifndef ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_DISTRIBUTED_OPTIMIZER_H_
#define ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_DISTRIBUTED_OPTIMIZER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "buffers/bucket_group.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "optimizers/chained.h"
#include "optimizers/kinds.h"
#include "optimizers/routing.h"
#include "optimizers/slot_optimizer.h"

namespace orthoshard::optimizers::distributed {

enum class DistributedMode {
  kSharded,     // layer-wise Muon + ZeRO-1 AdamW; grads reduce-scattered, params all-gathered
  kReplicated,  // grads all-reduced, every rank steps every param (baseline)
};

// GradStats summed over the ranks of `comm` (which must outlive it): ONE fp64 all-reduce of
// [AdamW sum of squares, Muon sum of squares, ranks with a non-finite gradient, param sum of
// squares, zero gradients] (the last two 0 unless ChainedConfig asks for them). A rank whose
// GradStats::nonfinite is set (ChainedOptimizer::LocalGradStats sets it) sends zeros and its flag,
// so the flag alone decides (inf - inf cannot turn into a finite sum).
class AllReduceStatsReducer final : public StatsReducer {
 public:
  explicit AllReduceStatsReducer(collectives::Communicator* comm) : comm_(comm) {}
  absl::StatusOr<GradStats> Reduce(const GradStats& local) override;

 private:
  collectives::Communicator* comm_;
};

// The routing the layout publishes: every param of `buffers` with its ParamPlacement::role, in
// buffer order.
RoutingReport LayoutRouting(absl::Span<buffers::ParamAndGradBuffer* const> buffers);

// The slots rank `rank` updates in `mode` (see the file comment): views of the buffers' params and
// grads. Errors: kInvalidArgument when a buffer is null, kReplicated over a buffer with sharded
// residency, or a Muon param straddles a shard boundary ("param 'w' is routed to muon but straddles
// a shard boundary of a distopt buffer; Muon needs whole matrices (use a shard-aligned layout)").
// `expert_rank` (>= 0) is the rank in the expert data-parallel group, used for expert buffers
// (layout key.expert); -1: `rank` for every buffer.
absl::StatusOr<std::vector<Slot>> RankSlots(absl::Span<buffers::ParamAndGradBuffer* const> buffers,
                                            int rank, DistributedMode mode, int expert_rank = -1);

// The ChainedOptimizer of rank comm->rank() over `buffers` (routes from the layout, slots from
// RankSlots, statistics reduced over `comm` in kSharded mode). `splits` maps a fused param's name
// to its blocks (QKV, SwiGLU fc1), orthogonalised separately in both modes. `comm` and the buffers
// must outlive the optimizer. Errors: kInvalidArgument for a buffer whose dp is not comm->size(),
// those of RankSlots and ChainedOptimizer::Create.
// `param_sync` (may be null; must outlive the optimizer): the bucket groups of `buffers` (and
// possibly more), whose param sync every Step then runs (see the file comment). Errors: also
// kInvalidArgument for a buffer that is not one of param_sync's, or a param_sync whose grad sync
// does not match `mode` (kSharded: reduce-scatter; kReplicated: all-reduce).
// Experts (MoE): `expert_comm` (may be null: `comm`) is the expert data-parallel group over which
// the expert buffers (layout key.expert) are sharded, this rank's slots in them by its rank
// there; `comm` is then the dense data-parallel group spanning every ep rank (the world without
// tensor parallelism), over which the statistics are summed: every param is counted once at any
// (dp, ep) with expt_dp = dp / ep (no "dp size 1" shortcut). Replicated with experts split over
// ep ranks sums each rank's saved elements (ChainedConfig::stats_over_saved_elements) over
// `comm`: one all-reduce per step it otherwise does not need. Errors: also kInvalidArgument when
// expert buffers are present and expert_comm's size does not divide that of the group the
// statistics are summed over (`comm`, or tensor_parallel.stats: dense dp 1 with expert dp 2 is
// valid only with the tp x dp grid as stats). Errors (tensor parallelism): kInvalidArgument for a
// split param whose TpSplit is not over `tp`, a stats communicator of another size, kSharded with
// tp and no stats, a blockwise split whose slices hold no whole blocks, and
// CollectiveTpNewtonSchulz's.
// Tensor parallelism (issue 34). The buffers hold tp-local slices (layout ParamSpec::tp /
// ParamPlacement::tp, each param's split over the tp group; the layout is computed from the local
// shapes, the same on every tp rank, so the dp owner of a split matrix's slice is the same dp index
// on every tp rank and the owners of all its slices form one tp group).
//   tp     this rank's tp group (null, or 1 rank: no tensor parallelism); the TpSplit of every
//          split param must be over it (size and rank). Muon slots split over it are
//          orthogonalised as `mode` says (MuonTpMode: kOwner, the default, gives each split
//          matrix one home in the tp group, optimizers/distributed/tp_newton_schulz.h; kDuplicated
//          all-gathers it; kBlockwise orthogonalises each slice alone); `splits` then gives the
//          GLOBAL matrix's blocks. Params not split (norms, router) are stepped as without TP.
//   stats  the communicator the step's gradient statistics are summed over: the tp x dp grid (the
//          world, when the grid is tp x dp); size tp x comm. Every element is counted once: split
//          params' slices by their tp rank, params not split by tp rank 0 only
//          (ChainedConfig::stats_skip_tp_replicated); kSharded: each rank's shards (one
//          all-reduce); kReplicated: each rank's saved elements (one all-reduce). Required for
//          kSharded with TP; kReplicated without it sums over `tp` alone (every dp rank holds the
//          same).
struct TensorParallelOptimizer {
  collectives::Communicator* tp = nullptr;
  collectives::Communicator* stats = nullptr;
  MuonTpMode mode = MuonTpMode::kOwner;
};

absl::StatusOr<std::unique_ptr<ChainedOptimizer>> CreateDistributedOptimizer(
    std::vector<buffers::ParamAndGradBuffer*> buffers, collectives::Communicator* comm,
    ChainedConfig config, DistributedMode mode,
    const std::map<std::string, FusedSplit>& splits = {},
    buffers::BucketGroupSync* param_sync = nullptr,
    collectives::Communicator* expert_comm = nullptr,
    const TensorParallelOptimizer& tensor_parallel = {});

}  // namespace orthoshard::optimizers::distributed

#endif  // ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_DISTRIBUTED_OPTIMIZER_H_
