// Contiguous parameter and gradient storage for one PerBufferParamLayout (Megatron-LM's
// `_ParamAndGradBuffer`): every model param becomes a view into `param_data` at its layout offset,
// its gradient a view into `grad_data`, and buckets, bucket groups and per-rank shards are views of
// both, ready to be reduce-scattered and all-gathered in place.
//
// How params and grads alias the buffer:
//   - Params: `param.set_data(view)` (C++ for Python's `param.data = view`) swaps the storage of
//     the model's own TensorImpl, so every at::Tensor handle the model holds now reads and writes
//     `param_data`, and autograd metadata (requires_grad, leaf-ness, hooks) is kept. Existing
//     values are copied in first.
//   - Grads: `param.mutable_grad()` is set to the view into `grad_data`. Autograd's AccumulateGrad
//     adds into a defined `.grad` in place (`grad += new_grad` outside create_graph), so backward
//     writes straight into `grad_data`. When the grad dtype differs from the param dtype (fp32
//     grads for bf16 params), `.grad` is the fp32 view and the in-place add promotes the bf16
//     gradient: the model sees fp32 grads, which is what the optimizers want.
//   - Callers must keep the views: zero grads with ZeroGrads() (never `set_to_none` or assigning a
//     new `.grad`), and never `set_data` a param again, or it stops aliasing the buffer.
//
// Residency (BufferOptions::residency) says what a rank keeps between uses:
//   kFull     every rank holds all of param_data and grad_data (DDP, ZeRO-1): params are always
//             readable, and a rank's shard of a bucket is a view inside the bucket.
//   kSharded  each rank keeps only its own shard of every bucket, of params and of grads, in
//             persistent shard storage (ZeRO-3 / FSDP). Each bucket also has a full-size param
//             tensor and grad tensor whose storage is TRANSIENT: allocated by MaterializeParams /
//             MaterializeGrads and freed by ReleaseParams / ReleaseGrads. The model's params and
//             their `.grad` are views of those transient tensors: the storage object stays the
//             same, only its memory comes and goes (as PyTorch FSDP frees and re-allocates an
//             unsharded flat param's storage), so the model's tensors, views of them that autograd
//             saved, and `.grad` all stay valid across a release and a later materialization.
//             Reading a param of a bucket that is not materialized (and filled by a param sync)
//             is reading freed memory: whoever drives the buffer (ddp/) materializes and gathers a
//             bucket before the layers that read it run, and materializes its grads before
//             autograd accumulates into them.
#ifndef ORTHOSHARD_BUFFERS_PARAM_AND_GRAD_BUFFER_H_
#define ORTHOSHARD_BUFFERS_PARAM_AND_GRAD_BUFFER_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "layout/layout.h"

namespace orthoshard::buffers {

// The at::ScalarType of a DType.
at::ScalarType ToScalarType(DType dtype);

// What a rank keeps of a buffer between uses (see the file comment).
enum class Residency {
  kFull,     // the whole buffer, params and grads
  kSharded,  // this rank's shard of every bucket; full buckets only while materialized
};

// Bytes of transient storage (materialized param and grad buckets of kSharded buffers) held now,
// and the most ever held at once. One object may be shared by the buffers of a model, so that the
// peak is the peak of their sum. Not thread-safe (buffers are driven from one thread).
class TransientMemory {
 public:
  void Add(int64_t bytes) {
    now_ += bytes;
    if (now_ > peak_) peak_ = now_;
  }
  void Remove(int64_t bytes) { now_ -= bytes; }
  int64_t now() const { return now_; }
  int64_t peak() const { return peak_; }
  // Restarts the peak from what is held now.
  void ResetPeak() { peak_ = now_; }

 private:
  int64_t now_ = 0;
  int64_t peak_ = 0;
};

struct BufferOptions {
  // Consecutive buckets communicated together as one group (Megatron's bucket group); >= 1.
  int buckets_per_group = 1;
  // Where param_data and grad_data live; params must already be there.
  c10::Device device = c10::Device(c10::kCPU);
  // What this rank keeps between uses.
  Residency residency = Residency::kFull;
  // kSharded: this rank, whose shard of every bucket is kept; in [0, layout dp). Unused by kFull.
  int rank = 0;
  // kSharded: where transient bytes are counted; null means a counter of this buffer's own.
  std::shared_ptr<TransientMemory> transient;
};

// What a buffer holds on this rank, in bytes.
struct BufferMemory {
  int64_t param_bytes = 0;      // persistent params: the whole buffer (kFull) or this rank's shards
  int64_t grad_bytes = 0;       // persistent grads, likewise
  int64_t transient_bytes = 0;  // materialized full buckets of params and grads now (kSharded)
};

// Buckets that are synchronized together, in bucket order.
struct BucketGroup {
  std::vector<int> buckets;  // indices into PerBufferParamLayout::buckets, consecutive
};

class ParamAndGradBuffer {
 public:
  // Builds the buffer and turns the params it places into views of it (modifying those params'
  // TensorImpls in place: the handles the model holds see the change). `model_params` is every
  // model param in the order of the ParamSpec list the layout was computed from (indexed by
  // ParamPlacement::param_index); params of other buffers are left alone.
  // Preconditions: params are leaves, not views of one another.
  // Errors (nothing is modified): kInvalidArgument naming the param for an index out of range, an
  // undefined tensor, a dtype other than the layout's param dtype, a numel other than the
  // placement's, a device other than options.device; naming the bucket or param for a layout whose
  // buckets are not contiguous, not dp equal shards, or do not contain their params; for
  // buckets_per_group < 1; for a kSharded rank outside [0, dp).
  // kSharded: each param's elements inside this rank's shard are copied into the shard storage;
  // the param and its `.grad` then alias the (released) transient bucket, so the param's own
  // former storage is freed when nothing else holds it.
  static absl::StatusOr<std::unique_ptr<ParamAndGradBuffer>> Create(
      const layout::PerBufferParamLayout& layout, const std::vector<at::Tensor>& model_params,
      const BufferOptions& options = {});

  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  const layout::PerBufferParamLayout& layout() const { return layout_; }
  Residency residency() const { return residency_; }
  // kSharded: the rank whose shards this buffer keeps.
  int rank() const { return rank_; }

  // The whole buffer, kFull only (undefined tensors in kSharded, where no rank holds it whole).
  const at::Tensor& param_data() const { return param_data_; }  // [numel] param dtype
  const at::Tensor& grad_data() const { return grad_data_; }    // [numel] grad dtype

  int num_buckets() const { return static_cast<int>(layout_.buckets.size()); }
  const std::vector<BucketGroup>& bucket_groups() const { return bucket_groups_; }
  // Index into layout().params of every param in bucket `bucket`, in buffer order.
  const std::vector<int>& BucketParams(int bucket) const { return bucket_params_[bucket]; }

  // Bucket `bucket` whole ([bucket numel]; kSharded: its transient tensor, whose contents exist
  // only while materialized) and shard `rank` of it ([shard_size]; kSharded: the persistent shard,
  // and `rank` must be rank()). The optimizer reads and writes shards; collectives fill buckets.
  // Preconditions (DCHECKed): 0 <= bucket < num_buckets(), 0 <= rank < layout().dp.
  at::Tensor ParamBucket(int bucket) const;
  at::Tensor GradBucket(int bucket) const;
  at::Tensor ParamShard(int bucket, int rank) const;
  at::Tensor GradShard(int bucket, int rank) const;

  // The model param placed at layout().params[i] (a view of param_data, or of its bucket's
  // transient tensor), and views shaped like it into the param and grad buckets.
  const at::Tensor& Param(int i) const { return params_[i]; }
  at::Tensor ParamView(int i) const;
  at::Tensor GradView(int i) const;

  // Writes `value` (param i's numel, any float dtype and device) as param i's value into what this
  // rank keeps: the whole param (kFull) or the elements of it in this rank's shard (kSharded). For
  // initialising params that were built without values. Precondition (DCHECKed): the numel.
  void SetParam(int i, const at::Tensor& value);

  // kSharded: allocates the memory of bucket `bucket`'s full param tensor (contents undefined
  // until a param sync fills it) or grad tensor (zeroed); frees it again. No-ops for kFull, where
  // everything is always there, and when already in that state. Release only what no collective
  // is writing and no pending computation reads.
  void MaterializeParams(int bucket);
  void ReleaseParams(int bucket);
  void MaterializeGrads(int bucket);
  void ReleaseGrads(int bucket);
  bool params_materialized(int bucket) const;
  bool grads_materialized(int bucket) const;

  // Zeroes every gradient this rank holds in place (kFull: grad_data; kSharded: the grad shards
  // and any materialized grad bucket); every `.grad` view stays valid.
  void ZeroGrads();

  BufferMemory memory() const;
  const TransientMemory& transient() const { return *transient_; }

 private:
  ParamAndGradBuffer(const layout::PerBufferParamLayout& layout, const BufferOptions& options);
  // The elements of param `i` that lie in this rank's shard: [begin, end) in buffer offsets.
  std::pair<int64_t, int64_t> OwnedRange(int i) const;
  // Writes `flat` (param i whole, flattened) into what this rank keeps of its values (`grads`
  // false) or of its gradient: the whole param (kFull) or its elements in this rank's shard.
  void WriteKept(int i, const at::Tensor& flat, bool grads);

  layout::PerBufferParamLayout layout_;
  Residency residency_ = Residency::kFull;
  int rank_ = 0;
  at::Tensor param_data_;  // kFull
  at::Tensor grad_data_;   // kFull
  // kSharded: this rank's shards of all buckets back to back ([sum of shard sizes]), bucket b's
  // starting at shard_offsets_[b]; and every bucket's full tensors with transient storage.
  at::Tensor param_shards_;
  at::Tensor grad_shards_;
  std::vector<int64_t> shard_offsets_;
  std::vector<at::Tensor> param_buckets_;
  std::vector<at::Tensor> grad_buckets_;
  std::vector<bool> params_materialized_;
  std::vector<bool> grads_materialized_;
  std::shared_ptr<TransientMemory> transient_;
  std::vector<at::Tensor> params_;  // parallel to layout_.params
  std::vector<BucketGroup> bucket_groups_;
  std::vector<std::vector<int>> bucket_params_;
};

}  // namespace orthoshard::buffers

#endif  // ORTHOSHARD_BUFFERS_PARAM_AND_GRAD_BUFFER_H_
