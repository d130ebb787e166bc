// Data-parallel training over contiguous buffers (Megatron-LM's DistributedDataParallel): the
// model's params become views of one ParamAndGradBuffer per PerBufferParamLayout; backward
// accumulates gradients straight into the grad buffers; grad sync reduce-scatters every bucket so
// each rank holds the mean gradient of its shard (or all-reduces it, for replicated optimizers);
// param sync all-gathers every bucket straight into param_data after the optimizer updated each
// rank's shard. DDP keeps the hooks, the layer bookkeeping, the micro-batch state and the memory
// accounting; the bucket groups themselves -- starting and finishing each group's grad sync and
// param sync, whether each is in flight, and the order every rank launches them in -- are one
// buffers::BucketGroupSync (buffers/bucket_group.h), which DDP's hooks and the distributed
// optimizer ask (bucket_groups()).
//
// One training step, as the caller drives it:
//   ddp.ZeroGradBuffers();
//   for each micro-batch m of M:
//     ddp.set_is_last_microbatch(m == M - 1);    // no communication before the last one
//     forward (the layer hooks before/after each layer), loss.backward();
//   RETURN_IF_ERROR(ddp.FinishGradSync());      // each rank: mean grads of its shards
//   optimizer->Step();                          // an optimizer given ddp.bucket_groups()
//                                               // (optimizers/distributed) starts each group's
//                                               // param sync as its part is written, and the rest
//                                               // at the end of the step; the next forward's hooks
//                                               // wait per layer
//   ddp.FinishParamSync() before reading params outside a forward (checkpoints, checksums).
// Without such an optimizer, whoever writes the shards calls bucket_groups().BeginParamSync()
// before and bucket_groups().StartParamSync() after.
//
// Cross-rank contract: every rank calls these methods in the same order with the same model, the
// same layout, the same config and the same `is_last_microbatch` sequence, and runs forward and
// backward over the same graph (gradients of the same params). The collectives each call launches
// are then the same on every rank: for each communicator, the bucket groups of all buffers on it
// are launched in one fixed order computed from the layout (see GradReduceOrder()), whatever the
// order in which gradients become ready, so ranks never launch mismatched collectives (the chains
// of buffers/bucket_group.h).
//
// Parameter sharding (DdpConfig::residency = kSharded; ZeRO-3 / FSDP). Between uses each rank keeps
// only its shard of every bucket, of params and of grads (buffers::Residency::kSharded); full
// buckets are transient:
//   forward   before layer L runs, the bucket groups holding a param that L reads are gathered
//             (materialized, all-gathered and waited on), and those of layer L + 1 are launched
//             (prefetch); after L's forward, every group of L that layer L + 1 does not read is
//             released, even if a later layer reads it again (a tied embedding, read by layer 0
//             and the head, is released after layer 0 and gathered again for the head), so the
//             forward holds the groups of at most two layers. Except in grad mode for the last
//             layer (its backward comes next) or with reshard_after_forward off (kept until
//             backward).
//   backward  LayerHooks::post_forward puts a hook on layer L's output, so that before L's backward
//             its groups are gathered again (normally launched by the prefetch of layer L + 1's
//             backward) and those of layer L - 1 are launched. That hook runs once the gradient of
//             L's output is complete, i.e. after every node of layer L + 1's backward (each lies
//             on a path from L's output to L + 1's); so it first releases every group of layer
//             L + 1 that layer L does not read: a group is released as soon as the backward of
//             the next layer (in backward order) that reads it is done, and gathered again when a
//             later one needs it (the tied embedding: released after the head's backward,
//             gathered for layer 0's). Gradients accumulate into the full grad buckets,
//             materialized (zeroed) right before the first gradient of a step reaches them,
//             separately from the params (a released param group does not touch its grads). Once
//             every gradient of a group is accumulated in a backward, nothing reads its params any
//             more (autograd accumulates a leaf's gradient after every node that uses it) and they
//             are released. In the last micro-batch a complete group is reduce-scattered into this
//             rank's grad shards as above, and its full grads are released once the
//             reduce-scatter finished (at the latest in FinishGradSync). Before a group's full
//             grads are materialized, the oldest reduce-scatters are waited on until at most
//             DdpConfig::grad_syncs_in_flight remain in flight. A layer named in MakeLayerHooks'
//             lookup_layers (an embedding) gathers nothing for its backward.
//   micro-batches  GradAccumulation::kFull (default): the full grads of a step stay until the last
//             micro-batch's reduce-scatter, so the mean gradient is computed exactly as with kFull
//             residency (accumulated, then reduced once). GradAccumulation::kSharded: every
//             micro-batch is reduce-scattered as the last one is, and the second and later ones
//             add into this rank's grad shards (BucketGroupSync::set_accumulate_grad_shards), so
//             no full grads outlive a micro-batch's backward (its grad syncs are finished when its
//             backward ends).
//   step      the optimizer updates this rank's shards; the param sync at its end gathers nothing
//             and releases whatever is still gathered (the next forward gathers what it needs).
// The gathers and reduce-scatters are the same collectives as kFull's, on the same buckets, so a
// sharded run computes the same values in the same order as a full one: bitwise the same params
// (with GradAccumulation::kSharded only at one micro-batch; see GradAccumulation for M > 1).
//
// The transient bound (kSharded, TransientBoundOf). With R(L) the groups holding a param that layer
// L reads (its own and extra reads), O(L) the groups whose params' own layers span L (lowest own
// layer <= L <= highest), F = DdpConfig::grad_syncs_in_flight, and P(S), G(S) the full param and
// grad bytes of the groups S:
//   peak_transient_bytes <= max_L P(R(L) u R(L+1)) + max_L G(O(L) u O(L+1)) + F * max_g G({g})
// for steps of one micro-batch or with GradAccumulation::kSharded, over any number of layers: the
// params of the current and the prefetched layer; the grads of the groups being accumulated
// (those of the layer whose backward runs and of the one before it in backward order, whose last
// gradients may still land) and of those whose reduce-scatter is in flight. Layers of the same
// size give the same bound at any depth. It assumes a param's gradient is complete once the
// backward of its own layer is (extra reads come from later layers, as a tied head). With
// GradAccumulation::kFull and M > 1 micro-batches the whole grad buffer is held from the first
// micro-batch to the last one's reduce-scatter.
// Cross-rank: in kSharded, backward launches collectives from autograd hooks in the order the
// engine runs them, which is the same on every rank for the same graph (as with
// overlap_grad_reduce). Whatever drives the model must call LayerHooks around every layer of every
// forward, in grad mode and not: reading a param whose group is not gathered reads freed memory.
//
// Threading: not thread-safe. Backward must run on the thread that owns this object (LibTorch's
// CPU autograd runs the hooks on the thread that called backward). GPU streams are not handled.
#ifndef ORTHOSHARD_DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define ORTHOSHARD_DDP_DISTRIBUTED_DATA_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "buffers/bucket_group.h"
#include "buffers/bucket_sync.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "layout/layout.h"

namespace orthoshard::ddp {

// Something DDP did, reported to DdpConfig::on_event (tests and benchmarks observe the order of
// launches and waits through it).
struct SyncEvent {
  enum class Kind {
    kGradReduceLaunched,   // a bucket group's reduce-scatter was launched
    kGradReduceWaited,     // ... and waited on successfully
    kParamGatherLaunched,  // a bucket group's all-gather was launched
    kParamGatherWaited,    // ... and waited on successfully
    kBackwardEnded,        // the autograd engine finished the backward pass of the last micro-batch
    kParamsReleased,
    kGradsReleased,
  };
  // kSharded residency only:
  //   kParamsReleased: a bucket group's gathered params were freed (buffer, group, layer: the
  //     layer after whose forward, or -1 during backward or at the step's param sync).
  //   kGradsReleased: a bucket group's full grads were freed after their reduce-scatter.
  Kind kind = Kind::kBackwardEnded;
  int buffer = -1;  // index into FullParamLayout::buffers (-1 for kBackwardEnded)
  int group = -1;   // index into that buffer's bucket_groups() (-1 for kBackwardEnded)
  int layer = -1;   // the layer whose pre-forward hook caused it, or -1
};
const char* SyncEventKindName(SyncEvent::Kind kind);  // "grad_reduce_launched", ...

// How kSharded residency accumulates gradients over the micro-batches of a step.
//   kFull     each rank accumulates its full local gradient over every micro-batch in the full grad
//             buckets and reduce-scatters once, in the last one: mean = sum_r fl(sum_m g_mr) / dp,
//             bitwise what kFull residency computes. The whole grad buffer is held while it
//             accumulates.
//   kSharded  every micro-batch's gradient is reduce-scattered (pre-scaled by 1/dp) and added into
//             this rank's grad shard: shard = sum_m fl(sum_r g_mr / dp). The same terms summed in
//             another order: not bitwise equal to kFull when M > 1. Per element, with t_mr =
//             g_mr * fl(1/dp) exactly (the scale both apply) and u = 2^-24, kFull puts each term
//             through at most M - 1 + 1 + dp - 1 = M + dp - 1 roundings (accumulate, scale, the
//             cross-rank sum) and kSharded through at most 1 + M * dp (scale; in its own and each
//             later micro-batch the add of the old shard and dp - 1 cross-rank additions), so
//             (Higham 3.1, gamma_k = k u / (1 - k u)) each is within gamma_k sum_mr |t_mr| of the
//             exact sum and |kFull - kSharded| <= (gamma_{M+dp-1} + gamma_{M*dp+1}) sum_mr |t_mr|.
//             At M = 1 the ops are kFull's: bitwise equal. Needs kSharded residency.
enum class GradAccumulation { kFull, kSharded };

// Configuration (Megatron's DistributedDataParallelConfig).
struct DdpConfig {
  // Launch each bucket group's reduce-scatter during backward, as soon as the last gradient of the
  // group (and of every group before it in GradReduceOrder()) was accumulated in the last
  // micro-batch. Off: FinishGradSync launches every reduce-scatter.
  bool overlap_grad_reduce = true;
  // The step's param sync (BucketGroupSync::StartParamSync) launches only the first bucket group's
  // all-gather (in forward order), or the groups whose part the step wrote (a staged step); the
  // pre-forward hook waits on each group just before the first layer that needs it and launches the
  // next one. Off: the param sync launches every all-gather and waits for all of them.
  bool overlap_param_gather = false;
  // How gradients reach the optimizer (buffers/bucket_sync.h): kReduceScatter for the sharded
  // optimizers (each rank ends with the mean of its own shards; params return by the param sync),
  // kAllReduce for replicated ones (every rank ends with the whole mean and updates every param
  // itself, so there is no param sync: the param sync calls and the pre-forward hook do nothing).
  buffers::GradSync grad_sync = buffers::GradSync::kReduceScatter;
  // Consecutive buckets communicated as one group (one LaunchGroup, one Work); >= 1.
  int buckets_per_group = 1;
  // Require fp32 gradient buffers, so gradients are accumulated and reduced in fp32 (plan the
  // layout with LayoutOptions::grad_dtype = kFloat32). Off: whatever grad dtype the layout chose.
  bool grad_reduce_in_fp32 = true;
  // true: the result is the mean over the data-parallel ranks: each bucket is multiplied by
  // 1 / (ranks of its communicator) before a SUM reduce-scatter (Megatron's gradient pre-scaling;
  // in low precision this keeps the sum in range). false: the plain sum.
  bool average_gradients = true;
  // Bound on every wait for a collective; std::nullopt means the communicator's timeout().
  std::optional<absl::Duration> timeout;
  // Called after every event (see SyncEvent) on the calling thread; may be empty.
  std::function<void(const SyncEvent&)> on_event;
  // What each rank keeps between uses: kFull (the whole buffers: DDP, ZeRO-1) or kSharded (its
  // shard of every bucket, full buckets gathered per layer: ZeRO-3; see the file comment).
  // kSharded needs grad_sync = kReduceScatter and gathers per layer whatever overlap_param_gather
  // says.
  buffers::Residency residency = buffers::Residency::kFull;
  // kSharded: release a group's gathered params after the forward of the last layer that reads
  // it, and gather them again for backward (two gathers per micro-batch, least memory). false:
  // keep them from the forward until their gradients are complete (one gather per micro-batch,
  // the whole model's params held during forward and backward, ZeRO-2-like).
  bool reshard_after_forward = true;
  // kSharded: launch the gathers of the next layer (forward) or the previous one (backward) while
  // the current layer computes. false: each gather is launched when its layer starts and waited
  // on at once (nothing hidden; for measuring what prefetching hides).
  bool prefetch = true;
  // kSharded: how gradients are accumulated over micro-batches (see GradAccumulation).
  GradAccumulation grad_accumulation = GradAccumulation::kFull;
  // kSharded: the most reduce-scatters left in flight when a group's full grads are materialized
  // (the term F of the transient bound); >= 0. 0 waits for every earlier one (least memory: the
  // reduce-scatter of a layer overlaps only the next layer's backward up to its first weight
  // gradient); higher hides more communication and holds more full grads.
  int grad_syncs_in_flight = 1;
};

// The functions a model calls around each of its layers (torch::nn::Module has no forward hooks),
// for every forward pass, in grad mode or not:
//   pre_forward(L)          right before layer L (0-based, forward order) reads any param;
//                           exactly once per layer per forward pass, L increasing.
//   post_forward(L, output) after layer L issued every read of its params, with the tensor its
//                           backward starts from (the layer's output: all of L's backward runs
//                           after the gradient of `output` is computed). May be undefined, e.g.
//                           under no-grad. kFull residency ignores it. kSharded also relies on
//                           the layers being a chain: every node of L + 1's backward that reads
//                           a param lies on a path from L's output, so the gradient of L's output
//                           is complete only once they all ran (then L + 1's groups are released).
// Failures are recorded and returned by the next FinishGradSync / FinishParamSync (the forward
// then ran on stale params and must be discarded). The functions
// refer to the DistributedDataParallel that made them: never call them after it is destroyed.
struct LayerHooks {
  std::function<void(int layer)> pre_forward;
  std::function<void(int layer, const at::Tensor& output)> post_forward;
};

// What this rank holds of the buffers, in bytes (see buffers::BufferMemory), and the most
// transient bytes (gathered params, full grads) it held at once since the last ResetPeak.
struct DdpMemory {
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t transient_bytes = 0;
  int64_t peak_transient_bytes = 0;
};

// The terms of the transient bound of the file comment, in bytes (kSharded).
struct TransientBound {
  int64_t params = 0;      // max_L P(R(L) u R(L+1))
  int64_t grads = 0;       // max_L G(O(L) u O(L+1))
  int64_t grad_syncs = 0;  // F * max_g G({g})
  int64_t total() const { return params + grads + grad_syncs; }
};

// Time this rank spent blocked on collectives DDP launched, since Create: the communication that
// was not hidden behind computation (wall time inside Work::Wait).
struct DdpWaits {
  double param_gather_s = 0;  // param all-gathers (the kFull param sync and kSharded gathers)
  double grad_sync_s = 0;     // grad reduce-scatters / all-reduces
};

class DistributedDataParallel {
 public:
  // Builds one ParamAndGradBuffer per buffer of `layout` (turning `params` into views of them) and
  // hooks every param's gradient accumulator.
  //   params: every model param, in the order of the ParamSpec list `layout` was computed from
  //     (forward order); leaves with requires_grad, on dense_comm->device() (where the buffers
  //     are allocated), dtypes and numels as planned.
  //   dense_comm: the data-parallel group of dense buffers; size() must equal their layout dp.
  //   expert_comm: the group of expert buffers (layout key.expert); nullptr means dense_comm.
  //   Both must outlive this object. With average_gradients every buffer's grads are scaled by
  //   1 / dense_comm->size(), expert ones too: an expert's gradient already sums what every ep
  //   rank's tokens contributed (BucketGroupOptions::average_over).
  // Errors: kInvalidArgument naming the param or buffer for a param placed in no buffer or in two,
  // a param without requires_grad or not a leaf, a communicator whose size differs from the
  // buffer's dp, communicators on different devices, a non-fp32 grad buffer with
  // grad_reduce_in_fp32, buckets_per_group < 1, grad_syncs_in_flight < 0, kSharded residency with
  // the all-reduce grad sync, GradAccumulation::kSharded with kFull residency;
  // and every error of ParamAndGradBuffer::Create.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      const layout::FullParamLayout& layout, const std::vector<at::Tensor>& params,
      collectives::Communicator* dense_comm, collectives::Communicator* expert_comm,
      const DdpConfig& config);

  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The buffers, parallel to FullParamLayout::buffers (for the optimizers and checkpoints).
  int num_buffers() const { return static_cast<int>(buffers_.size()); }
  buffers::ParamAndGradBuffer& buffer(int i) { return *buffers_[i]; }
  const buffers::ParamAndGradBuffer& buffer(int i) const { return *buffers_[i]; }

  // Whether the next backward is the last micro-batch of the step. While false, gradient hooks only
  // accumulate (no communication). Default true. Each micro-batch runs exactly one backward: in
  // the last one a gradient that becomes ready twice is an error (see FinishGradSync). The end of
  // the last backward is detected with the autograd engine's queue_callback and reported as
  // SyncEvent::kBackwardEnded.
  void set_is_last_microbatch(bool last) { is_last_microbatch_ = last; }
  bool is_last_microbatch() const { return is_last_microbatch_; }

  // Zeroes every grad buffer (the `.grad` views stay valid) and forgets which gradients were ready.
  // Call at the start of each step. Precondition: no grad sync in flight (FinishGradSync returned).
  void ZeroGradBuffers();

  // Writes `value` as the value of params[param_index] (the list given to Create) into what this
  // rank keeps of it (buffers::ParamAndGradBuffer::SetParam): for models built without values
  // (integration's Gpt::CreateUninitialized), so that a sharded rank never holds the whole model.
  // Errors: kInvalidArgument for an index out of range or a value with another element count.
  absl::Status SetParam(int param_index, const at::Tensor& value);

  // What this rank holds now, and the transient peak (kSharded; 0 for kFull).
  DdpMemory memory() const;
  void ResetPeakMemory();
  const DdpWaits& waits() const { return waits_; }

  // Launches the grad sync of every bucket group not launched yet (in GradReduceOrder()) and
  // waits for all of them. Afterwards, on each rank, GradShard(bucket, rank) of every bucket of
  // every buffer holds the mean (or, without average_gradients, the sum) over the ranks of that
  // buffer's communicator of their accumulated gradients. With kReduceScatter the rest of
  // grad_data is unspecified (partial sums, pre-scaled local gradients or the engine's scratch):
  // read only this rank's shards; with kAllReduce every bucket holds it whole. Errors: an error a gradient hook recorded during backward (kFailedPrecondition for a
  // gradient ready twice in one step; a launch error); from Wait, kDeadlineExceeded or kUnavailable
  // naming the buffer, bucket group, its buckets and the collective. After an error the
  // communicator is unusable (see communicator.h).
  absl::Status FinishGradSync();

  // The bucket groups of every buffer and their grad and param syncs (buffers/bucket_group.h):
  // give them to the optimizer that writes the shards (optimizers/distributed's
  // CreateDistributedOptimizer), so that its step starts the param sync. Valid as long as this
  // object; indices are buffer(i)'s.
  buffers::BucketGroupSync& bucket_groups() { return *sync_; }
  const buffers::BucketGroupSync& bucket_groups() const { return *sync_; }

  // Launches and waits on every bucket group's all-gather not waited on yet
  // (BucketGroupSync::FinishParamSync), for readers of params outside a forward. kSharded: waits
  // on the gathers in flight (no full params are kept between steps). Errors: one recorded by a
  // layer hook; from the all-gathers, as FinishGradSync.
  absl::Status FinishParamSync();

  // The first error a layer or gradient hook recorded since the last FinishGradSync,
  // FinishParamSync or TakeHookError, which clears it; OK when none. Hooks cannot return a status,
  // so after a hook's gather failed (a lost peer: the error names the rank and the collective)
  // forward or backward goes on over released params and LibTorch throws a c10::Error that names
  // nothing. Whoever catches that error should report this one instead.
  absl::Status TakeHookError() { return TakeError(); }

  // The layer hooks (see LayerHooks) for a model whose params[i] (the list given to Create) is
  // owned by forward layer param_layers[i] (non-negative, non-decreasing in i) and also read by the
  // layers `extra_reads` lists as (param index, layer) pairs (a tied embedding read by the output
  // head). kFull: pre_forward is the overlap_param_gather mechanism: it waits on every bucket group
  // that holds a param of layer L and was not waited on yet (launching it and the groups before it
  // in forward order first if needed), then launches the next group in forward order; without a
  // param sync in flight it does nothing. kSharded: see the file comment. Errors:
  // kInvalidArgument if param_layers has the wrong size, a layer out of range or a decreasing
  // layer index, or an extra read names a param or layer out of range.
  // lookup_layers (kSharded): layers whose backward reads none of the params (an embedding lookup:
  // its backward adds the output gradient into the weight's rows by index, never reading the
  // weight); nothing is gathered for their backward. Out of range: kInvalidArgument.
  absl::StatusOr<LayerHooks> MakeLayerHooks(
      const std::vector<int>& param_layers,
      const std::vector<std::pair<int, int>>& extra_reads = {},
      const std::vector<int>& lookup_layers = {});

  // The transient bound of the file comment for the layers of the last MakeLayerHooks.
  // Errors: kFailedPrecondition before MakeLayerHooks or with kFull residency.
  absl::StatusOr<TransientBound> TransientBoundOf() const;

  // MakeLayerHooks(param_layers).pre_forward, for kFull models that read only their own params.
  absl::StatusOr<std::function<void(int layer)>> PreForwardHook(
      const std::vector<int>& param_layers);

  // For each communicator (dense first, then expert if it differs), the (buffer, group) pairs in
  // the order their reduce-scatters are launched: a merge of every buffer's groups in bucket order
  // (= backprop order), by the forward index of the earliest param in the group, latest first
  // (BucketGroupSync::GradSyncOrder). All-gathers with overlap_param_gather go in reverse order.
  std::vector<std::vector<std::pair<int, int>>> GradReduceOrder() const {
    return sync_->GradSyncOrder();
  }

 private:
  class GradHook;
  // Sets the layer that SyncEvents carry while a layer hook runs.
  class EventLayer {
   public:
    EventLayer(DistributedDataParallel* ddp, int layer) : ddp_(ddp), saved_(ddp->event_layer_) {
      ddp_->event_layer_ = layer;
    }
    ~EventLayer() { ddp_->event_layer_ = saved_; }

   private:
    DistributedDataParallel* ddp_;
    int saved_;
  };

  explicit DistributedDataParallel(const DdpConfig& config);

  void OnGradReady(int param_index);
  void OnGradAboutToAccumulate(int param_index);
  void QueueBackwardCallback();
  void OnBackwardEnded();
  // Create's work: checks the layout, params and communicators, builds the buffers, then the rest.
  absl::Status ValidateAndBuild(const layout::FullParamLayout& layout,
                                const std::vector<at::Tensor>& params,
                                collectives::Communicator* dense_comm,
                                collectives::Communicator* expert_comm);
  absl::Status BuildSync(const std::vector<collectives::Communicator*>& comms, int num_params,
                         int dense_ranks);
  absl::Status HookGradients(const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names);
  void ResetGradSyncState();
  void OnSyncEvent(const buffers::BucketGroupEvent& event);
  void Emit(SyncEvent::Kind kind, int buffer, int group, int layer);
  absl::Status PreForward(int layer);
  buffers::ParamAndGradBucketGroup& group(std::pair<int, int> bg) const {
    return sync_->group(bg.first, bg.second);
  }
  bool sharded() const { return config_.residency == buffers::Residency::kSharded; }
  // kSharded (distributed_data_parallel_sharded.cc).
  absl::Status PrefetchLayer(int layer, bool backward);
  absl::Status ShardedPreForward(int layer);
  absl::Status ShardedPostForward(int layer, const at::Tensor& output);
  absl::Status ShardedPreBackward(int layer);
  // Releases the groups of layer `layer` that layer `next` does not read (next out of range:
  // none is read).
  absl::Status ReleaseUnlessRead(int layer, int next);
  // Whether layer `layer` (any int) reads group bg.
  bool Reads(int layer, std::pair<int, int> bg) const;
  bool sharded_accumulation() const {
    return config_.grad_accumulation == GradAccumulation::kSharded;
  }
  // Every micro-batch communicates (the last one, or each with sharded accumulation).
  bool communicates() const { return is_last_microbatch_ || sharded_accumulation(); }
  void RecordError(absl::Status status);
  absl::Status TakeError();
  // The bucket groups' errors name the buffer, group, buckets and collective; DDP's say "ddp: ".
  static absl::Status Ddp(absl::Status status);

  DdpConfig config_;
  std::vector<std::unique_ptr<buffers::ParamAndGradBuffer>> buffers_;
  std::unique_ptr<buffers::BucketGroupSync> sync_;  // the bucket groups of buffers_
  // Per model param: (buffer, group) and (buffer, placement index).
  std::vector<std::pair<int, int>> param_group_;
  std::vector<std::pair<int, int>> param_placement_;
  std::vector<bool> param_ready_;  // gradient ready in the current step's last micro-batch
  // Each param's grad accumulator (the tensor only holds it weakly) and its hook.
  std::vector<std::shared_ptr<void>> grad_accumulators_;  // torch::autograd::Node
  std::vector<std::uintptr_t> hook_keys_;
  std::vector<std::vector<std::pair<int, int>>> layer_groups_;  // [layer] -> (buffer, group)
  std::vector<bool> lookup_layer_;  // [layer]: its backward reads no params (MakeLayerHooks)
  // kSharded, per [buffer][group]: the params whose gradient was accumulated in the current
  // backward, and the lowest and highest own layer of its params (MakeLayerHooks).
  std::vector<std::vector<int>> accumulated_;
  std::vector<std::vector<std::pair<int, int>>> own_layers_;
  // kSharded: each param's tensor hook (runs before its gradient is accumulated) and the param.
  std::vector<unsigned> pre_hook_keys_;
  std::vector<at::Tensor> hooked_params_;
  int num_layers_ = 0;
  bool forward_grad_enabled_ = false;  // kSharded: grad mode of the forward pass in progress
  int event_layer_ = -1;  // the layer whose hook is running (SyncEvent::layer), or -1
  DdpWaits waits_;
  std::shared_ptr<buffers::TransientMemory> transient_;
  bool is_last_microbatch_ = true;
  bool backward_callback_queued_ = false;
  int microbatches_synced_ = 0;  // GradAccumulation::kSharded: micro-batches reduced this step
  absl::Status pending_error_;
};

}  // namespace orthoshard::ddp

#endif  // ORTHOSHARD_DDP_DISTRIBUTED_DATA_PARALLEL_H_
