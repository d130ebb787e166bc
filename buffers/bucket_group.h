// The bucket groups of a model's ParamAndGradBuffers and their grad sync and param sync (Megatron-LM's
// `_ParamAndGradBucketGroup` and its `next_param_gather_bucket_group` chain): one object per
// (buffer, bucket group) that starts and finishes its own collectives, holds their in-flight Works
// and knows whether each is in flight or done; and, over them, the order in which every rank
// launches them on each communicator. The collectives are buffers/bucket_sync.h's GradSyncOps and
// ParamSyncOps.
//
// Who calls what (ddp/ and optimizers/distributed/ ask this object; the trainer never sequences it):
//   backward      DDP's gradient hooks: RegisterGradReady per param of the last micro-batch (with
//                 overlap_grad_reduce a complete group's grad sync starts, in chain order);
//   after it      FinishGradSync: every grad sync started (chain order) and waited on;
//   step          the distributed optimizer: BeginParamSync, ParamSyncStageDone(s) as each stage
//                 of this rank's update is written (its groups' all-gathers start at once), then
//                 StartParamSync at the end of every step, skipped or not;
//   forward       DDP's pre-forward hook: FinishParamSyncFor(groups of the layer) (kFull: wait on
//                 them, launching earlier ones first, then start the next one), or the group's own
//                 StartParamSync / FinishParamSync / ReleaseParams (kSharded: gathered per layer);
//   readers       FinishParamSync (checkpoint saves, checksums) outside a forward.
//
// The chain. For each communicator the groups of every buffer on it are merged into one order: each
// buffer's groups in bucket order (= backprop order), picking at each step the head whose earliest
// param comes latest in forward order. Grad syncs start in that order and param syncs (kFull) in the
// reverse (forward) order; starting group k starts every earlier one first. So whatever order
// gradients become ready in and however far a forward or a staged step got, every rank launches the
// same collectives in the same order on each communicator.
//
// Cross-rank contract: every rank builds the same groups from the same layouts and calls the methods
// that launch collectives (RegisterGradReady with overlap, FinishGradSync, the param sync calls) in
// the same order with the same arguments. kSharded gathers are started per group in the order the
// layers run (the same on every rank for the same graph); they are not chained.
//
// Threading: not thread-safe; every call on one thread (LibTorch's CPU autograd runs hooks on the
// thread that called backward). GPU streams are not handled.
#ifndef ORTHOSHARD_BUFFERS_BUCKET_GROUP_H_
#define ORTHOSHARD_BUFFERS_BUCKET_GROUP_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "buffers/bucket_sync.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"

namespace orthoshard::buffers {

// Something a bucket group did, reported to BucketGroupOptions::on_event.
struct BucketGroupEvent {
  enum class Kind {
    kGradSyncLaunched,   // the group's reduce-scatter (or all-reduce) was launched
    kGradSyncWaited,     // ... and waited on successfully
    kParamSyncLaunched,  // the group's all-gather was launched
    kParamSyncWaited,    // ... and waited on successfully
    kParamsReleased,     // kSharded: the gathered full params were freed
    kGradsReleased,      // kSharded: the full grads were freed after their grad sync
  };
  Kind kind = Kind::kGradSyncLaunched;
  int buffer = -1;    // index into the buffers given to BucketGroupSync::Create
  int group = -1;     // index into that buffer's bucket_groups()
  double wait_s = 0;  // k*Waited: wall seconds blocked inside Work::Wait
};

struct BucketGroupOptions {
  // kReduceScatter (sharded optimizers; param syncs return the params) or kAllReduce (replicated
  // optimizers: no param sync, every param sync call does nothing).
  GradSync grad_sync = GradSync::kReduceScatter;
  // Multiply each bucket by 1 / (ranks of its communicator) before the SUM grad sync, so that the
  // result is the mean (Megatron's gradient pre-scaling). false: the plain sum.
  bool average_gradients = true;
  // With average_gradients, the ranks the mean is over, for every group: 0 means each group's
  // communicator size. Experts: the dense data-parallel size, because an expert's gradient on its
  // expt_dp rank already sums the contributions of every ep rank's tokens (routed to it by
  // all-to-all): Megatron's expert_gradient_scaling_factor = 1 / dense dp size.
  int average_over = 0;
  // Start a group's grad sync from RegisterGradReady as soon as it (and every group before it in
  // its chain) is complete. false: FinishGradSync starts them all.
  bool overlap_grad_reduce = true;
  // kFull: StartParamSync launches only the first group of each chain and the forward waits per
  // layer (FinishParamSyncFor); the step may be staged (num_param_sync_stages() > 0). false:
  // StartParamSync launches and waits on everything.
  bool overlap_param_gather = false;
  // kSharded: the most grad syncs left in flight when a group's full grads are materialized
  // (LimitGradSyncsInFlight); >= 0. Fewer: less transient memory, less overlap.
  int grad_syncs_in_flight = 1;
  // Bound on every wait; std::nullopt: the communicator's timeout().
  std::optional<absl::Duration> timeout;
  // Called after every event on the calling thread; may be empty.
  std::function<void(const BucketGroupEvent&)> on_event;
};

// One bucket group of one buffer, with its own sync state. Made by BucketGroupSync::Create.
class ParamAndGradBucketGroup {
 public:
  // Whether this rank's full params of the group are valid.
  enum class ParamState {
    kStale,     // not valid: a step updated only this rank's shard, or (kSharded) released
    kInFlight,  // the all-gather is launched, not waited on
    kSynced,    // gathered and waited on (kFull: also before the first step)
  };
  // The group's grad sync within the current step.
  enum class GradState { kNotStarted, kInFlight, kFinished };

  ParamAndGradBucketGroup(ParamAndGradBuffer* buffer, int buffer_index, int group,
                          collectives::Communicator* comm, const BucketGroupOptions* options);
  ParamAndGradBucketGroup(const ParamAndGradBucketGroup&) = delete;
  ParamAndGradBucketGroup& operator=(const ParamAndGradBucketGroup&) = delete;

  int buffer_index() const { return buffer_index_; }
  int group() const { return group_; }
  const std::vector<int>& buckets() const { return buffer_->bucket_groups()[group_].buckets; }
  ParamAndGradBuffer& buffer() const { return *buffer_; }
  collectives::Communicator& comm() const { return *comm_; }
  // "buffer 0 (KEY) bucket group 2 (buckets 4,5)": how errors name the group.
  std::string Name() const;
  // Params in the group, and the smallest ParamPlacement::param_index among them (forward order).
  int num_params() const { return num_params_; }
  int min_param_index() const { return min_param_index_; }

  // Counts one param whose gradient is complete for this step; true once all num_params() are.
  bool RegisterGradReady();
  bool grads_ready() const { return ready_ == num_params_; }

  // Launches the grad sync: (kSharded) materializes grads not materialized (zeros), pre-scales
  // (average_gradients), launches GradSyncOps as one group. With `accumulate` (kSharded and
  // kReduceScatter only: sharded grad accumulation), this rank's region of each full bucket first
  // adds what its grad shard holds, so that the reduce-scatter leaves in the shard its old value
  // plus the new mean (every rank adds only its own shard, to its own region: the SUM over ranks
  // counts it once). Precondition (DCHECKed): kNotStarted.
  // Errors: those of the launch, kInternal for a failed scale, each naming the group.
  absl::Status StartGradSync(bool accumulate = false);
  // Waits on the grad sync in flight, if any (then kFinished); kSharded: frees the full grads.
  // Errors: kDeadlineExceeded / kUnavailable from Wait, naming the group and the collective.
  absl::Status FinishGradSync();
  GradState grad_state() const { return grad_state_; }
  bool grad_sync_in_flight() const { return grad_state_ == GradState::kInFlight; }
  // Forgets the step's ready count and grad state. Precondition: no grad sync in flight.
  void ResetGradSync();

  // kSynced -> kStale: the step is about to write this rank's shard (kFull).
  void MarkParamsStale();
  // kStale: (kSharded) materializes the param buckets and launches the all-gather (kInFlight).
  // Otherwise nothing. Errors: those of the launch, naming the group.
  absl::Status StartParamSync();
  // Starts if kStale, waits if kInFlight: afterwards kSynced. Errors: as FinishGradSync.
  absl::Status FinishParamSync();
  // kSharded: waits on an all-gather in flight (never frees memory a collective writes), frees the
  // param buckets: kStale. kFull: nothing. Errors: as FinishParamSync.
  absl::Status ReleaseParams();
  ParamState param_state() const { return param_state_; }
  bool param_sync_in_flight() const { return param_state_ == ParamState::kInFlight; }

 private:
  absl::Status Wait(std::unique_ptr<collectives::Work>& work, bool gather);
  void Emit(BucketGroupEvent::Kind kind, double wait_s = 0) const;
  const char* GradCollective() const;

  ParamAndGradBuffer* buffer_;
  int buffer_index_;
  int group_;
  collectives::Communicator* comm_;
  const BucketGroupOptions* options_;
  int num_params_ = 0;
  int min_param_index_ = 0;
  int ready_ = 0;
  GradState grad_state_ = GradState::kNotStarted;
  ParamState param_state_ = ParamState::kSynced;
  std::unique_ptr<collectives::Work> grad_work_;
  std::unique_ptr<collectives::Work> param_work_;
};

// Every bucket group of a model's buffers and their per-communicator chains (see the file comment).
class BucketGroupSync {
 public:
  // One group per (buffer, bucket group) of `buffers`, buffer i's collectives on comms[i] (its
  // data-parallel group; buffers on the same communicator share a chain). Buffers and
  // communicators must outlive this object.
  // Errors: kInvalidArgument for a null buffer or communicator, sizes that differ, a communicator
  // whose size is not the buffer's layout dp, a kSharded buffer with the kAllReduce grad sync.
  static absl::StatusOr<std::unique_ptr<BucketGroupSync>> Create(
      std::vector<ParamAndGradBuffer*> buffers, std::vector<collectives::Communicator*> comms,
      BucketGroupOptions options);

  BucketGroupSync(const BucketGroupSync&) = delete;
  BucketGroupSync& operator=(const BucketGroupSync&) = delete;

  const BucketGroupOptions& options() const { return options_; }
  int num_buffers() const { return static_cast<int>(buffers_.size()); }
  ParamAndGradBuffer& buffer(int b) const { return *buffers_[b]; }
  // The index of `buffer` among those given to Create, or -1.
  int BufferIndex(const ParamAndGradBuffer* buffer) const;
  int num_groups(int b) const { return static_cast<int>(groups_[b].size()); }
  ParamAndGradBucketGroup& group(int b, int g) const { return *groups_[b][g]; }
  // The group of buffer b holding bucket `bucket`.
  int GroupOfBucket(int b, int bucket) const { return group_of_bucket_[b][bucket]; }
  // Group (b, g)'s chain (an index into GradSyncOrder()) and its position there.
  std::pair<int, int> ChainPosition(int b, int g) const {
    return chain_position_[group_offset_[b] + g];
  }
  // Per chain (communicator, in order of first appearance in the buffers), its (buffer, group)
  // pairs in grad sync (backprop) order; param syncs go in the reverse order.
  std::vector<std::vector<std::pair<int, int>>> GradSyncOrder() const;

  // ---- Grad sync.
  // One more param of group (b, g) has its complete gradient this step. With overlap_grad_reduce,
  // starts the grad sync of every complete group at the head of the chain. Errors: StartGradSync's.
  absl::Status RegisterGradReady(int b, int g);
  // Finishes a kFull param sync in flight, starts every grad sync not started (chain order), waits
  // on all, and resets the step's grad state. Afterwards each rank's GradShard(bucket, rank) holds
  // the mean (or sum) of its shard over the communicator (kAllReduce: every bucket whole).
  // Errors: the first start or wait error (then the communicator is unusable).
  absl::Status FinishGradSync();
  // Forgets which gradients were ready (ZeroGradBuffers). Precondition: no grad sync in flight.
  void ResetGradSync();
  // kSharded: whether the grad syncs started from now on add into this rank's grad shards instead
  // of overwriting them (StartGradSync's `accumulate`): set for the second and later micro-batches
  // of a step whose every micro-batch is reduce-scattered (sharded grad accumulation).
  void set_accumulate_grad_shards(bool accumulate) { accumulate_grad_shards_ = accumulate; }
  // kSharded: the most grad syncs in flight at once on a chain when one more starts (it first
  // waits on the oldest, releasing its full grads).
  static constexpr int kMaxShardedGradSyncsInFlight = 2;
  // kSharded: waits on grad syncs in flight (chain by chain, oldest first) until at most
  // options().grad_syncs_in_flight remain, releasing their full grads. Call before materializing a
  // group's full grads (StartGradSyncAt does, for a group none of whose gradients came). Waits
  // launch nothing, so ranks may call it at different points. Errors: FinishGradSync's.
  absl::Status LimitGradSyncsInFlight();

  // ---- Param sync (all no-ops with kAllReduce).
  // Stages of a staged step: one per kFull group in forward order of its chain (chains one after
  // another) with overlap_param_gather; 0 otherwise (kAllReduce, kSharded, or no overlap: the step
  // is not staged). ParamSyncStage(b, bucket) is the stage of buffer b's bucket, or -1 without stages.
  int num_param_sync_stages() const;
  int ParamSyncStage(int b, int bucket) const;
  // Before a step writes the shards: finishes a kFull param sync in flight and marks every kFull
  // group kStale (nothing launched). kSharded: nothing. Errors: FinishParamSync's.
  absl::Status BeginParamSync();
  // Stage `stage` of this rank's update is written: starts that group's all-gather and every earlier
  // one of its chain not started. Every rank calls it for every stage, in order.
  // Errors: kInvalidArgument for a stage out of [0, num_param_sync_stages()) or before
  // BeginParamSync; those of the launch.
  absl::Status ParamSyncStageDone(int stage);
  // After every step, skipped or not: kFull without overlap_param_gather: launches and waits on every
  // group; with it: starts the first group of each chain that no stage started (the forward waits
  // per layer). Begins the round first if BeginParamSync was not called. kSharded: releases every
  // gathered group (its contents predate the step). Errors: those of the launches and waits.
  absl::Status StartParamSync();
  // Launches and waits on every group not kSynced (kFull, in chain order); kSharded: waits on the
  // gathers in flight. For readers of params outside a forward. Errors: as StartParamSync.
  absl::Status FinishParamSync();
  // kFull, before a forward reads group (b, g): waits on it (starting it and every earlier group of
  // its chain first if needed), then starts the next group of the chain not started. Nothing when
  // the group is kSynced. Errors: those of the launches and waits.
  absl::Status FinishParamSyncFor(int b, int g);
  // Whether some kFull group is not kSynced (a param sync round is under way).
  bool param_sync_in_flight() const;
  // kSharded: ReleaseParams of every group. Errors: the first one (every group is still released).
  absl::Status ReleaseAllParams();

 private:
  struct Chain {
    collectives::Communicator* comm = nullptr;
    std::vector<ParamAndGradBucketGroup*> order;  // grad sync (backprop) order
  };

  explicit BucketGroupSync(BucketGroupOptions options) : options_(std::move(options)) {}
  void BuildChains(const std::vector<collectives::Communicator*>& comms);
  absl::Status StartGradSyncAt(Chain& chain, int pos);
  // Forward position f of a chain is grad position size - 1 - f.
  ParamAndGradBucketGroup& AtForward(const Chain& chain, int f) const {
    return *chain.order[chain.order.size() - 1 - f];
  }
  absl::Status StartParamSyncsThrough(Chain& chain, int f);
  bool full_param_sync() const;

  BucketGroupOptions options_;
  std::vector<ParamAndGradBuffer*> buffers_;
  std::vector<std::vector<std::unique_ptr<ParamAndGradBucketGroup>>> groups_;  // [buffer][group]
  std::vector<std::vector<int>> group_of_bucket_;                              // [buffer][bucket]
  std::vector<Chain> chains_;
  std::vector<std::pair<int, int>> chain_position_;  // [flattened group]: (chain, grad position)
  std::vector<int> group_offset_;                    // [buffer]: its first flattened group
  bool param_sync_begun_ = false;  // BeginParamSync ran; StartParamSync has not yet
  bool accumulate_grad_shards_ = false;
};

}  // namespace orthoshard::buffers

#endif  // ORTHOSHARD_BUFFERS_BUCKET_GROUP_H_
