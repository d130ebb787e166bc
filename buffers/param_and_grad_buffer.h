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
#ifndef ORTHOSHARD_BUFFERS_PARAM_AND_GRAD_BUFFER_H_
#define ORTHOSHARD_BUFFERS_PARAM_AND_GRAD_BUFFER_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "layout/layout.h"

namespace orthoshard::buffers {

// The at::ScalarType of a DType.
at::ScalarType ToScalarType(DType dtype);

struct BufferOptions {
  // Consecutive buckets communicated together as one group (Megatron's bucket group); >= 1.
  int buckets_per_group = 1;
  // Where param_data and grad_data live; params must already be there.
  c10::Device device = c10::Device(c10::kCPU);
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
  // buckets_per_group < 1.
  static absl::StatusOr<std::unique_ptr<ParamAndGradBuffer>> Create(
      const layout::PerBufferParamLayout& layout, const std::vector<at::Tensor>& model_params,
      const BufferOptions& options = {});

  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  const layout::PerBufferParamLayout& layout() const { return layout_; }

  const at::Tensor& param_data() const { return param_data_; }  // [numel] param dtype
  const at::Tensor& grad_data() const { return grad_data_; }    // [numel] grad dtype

  int num_buckets() const { return static_cast<int>(layout_.buckets.size()); }
  const std::vector<BucketGroup>& bucket_groups() const { return bucket_groups_; }
  // Index into layout().params of every param in bucket `bucket`, in buffer order.
  const std::vector<int>& BucketParams(int bucket) const { return bucket_params_[bucket]; }

  // Views of bucket `bucket` ([bucket numel]) and of shard `rank` of it ([shard_size]).
  // Preconditions (DCHECKed): 0 <= bucket < num_buckets(), 0 <= rank < layout().dp.
  at::Tensor ParamBucket(int bucket) const;
  at::Tensor GradBucket(int bucket) const;
  at::Tensor ParamShard(int bucket, int rank) const;
  at::Tensor GradShard(int bucket, int rank) const;

  // The model param placed at layout().params[i] (now a view of param_data), and views shaped
  // like it into param_data and grad_data.
  const at::Tensor& Param(int i) const { return params_[i]; }
  at::Tensor ParamView(int i) const;
  at::Tensor GradView(int i) const;

  // Zeroes grad_data in place; every `.grad` view stays valid.
  void ZeroGrads();

 private:
  ParamAndGradBuffer(const layout::PerBufferParamLayout& layout, const BufferOptions& options);

  layout::PerBufferParamLayout layout_;
  at::Tensor param_data_;
  at::Tensor grad_data_;
  std::vector<at::Tensor> params_;  // parallel to layout_.params
  std::vector<BucketGroup> bucket_groups_;
  std::vector<std::vector<int>> bucket_params_;
};

}  // namespace orthoshard::buffers

#endif  // ORTHOSHARD_BUFFERS_PARAM_AND_GRAD_BUFFER_H_
