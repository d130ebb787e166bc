#include "buffers/param_and_grad_buffer.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::buffers {

at::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kInt64:
      return at::kLong;
    case DType::kInt32:
      return at::kInt;
    case DType::kUInt8:
      return at::kByte;
  }
  return at::kFloat;
}

namespace {

absl::Status ValidateLayout(const layout::PerBufferParamLayout& layout) {
  if (layout.dp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer ", layout.key.ToString(), ": dp ", layout.dp, " must be at least 1"));
  }
  int64_t expected_start = 0;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const layout::Bucket& bucket = layout.buckets[b];
    if (bucket.start != expected_start || bucket.numel() != layout.dp * bucket.shard_size ||
        bucket.shard_size < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer ", layout.key.ToString(), ": bucket ", b, " is [", bucket.start, ", ", bucket.end,
          ") with shard_size ", bucket.shard_size, "; expected start ", expected_start, " and dp (",
          layout.dp, ") equal shards"));
    }
    expected_start = bucket.end;
  }
  for (const layout::ParamPlacement& p : layout.params) {
    if (p.bucket < 0 || p.bucket >= static_cast<int>(layout.buckets.size())) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': bucket ", p.bucket,
                                                     " is outside [0, ", layout.buckets.size(),
                                                     ")"));
    }
    const layout::Bucket& bucket = layout.buckets[p.bucket];
    if (p.start < bucket.start || p.end > bucket.end || p.start > p.end) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': [", p.start, ", ",
                                                     p.end, ") is not inside its bucket ", p.bucket,
                                                     " [", bucket.start, ", ", bucket.end, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateParam(const layout::ParamPlacement& p, const std::vector<at::Tensor>& params,
                           at::ScalarType dtype, const c10::Device& device) {
  if (p.param_index < 0 || p.param_index >= static_cast<int>(params.size())) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': param_index ",
                                                   p.param_index, " is outside the ", params.size(),
                                                   " model params"));
  }
  const at::Tensor& t = params[p.param_index];
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' is undefined"));
  }
  if (t.scalar_type() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' has dtype ",
                                                   c10::toString(t.scalar_type()),
                                                   ", the buffer holds ", c10::toString(dtype)));
  }
  if (t.numel() != p.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' has ", t.numel(),
                                                   " elements, the layout places ", p.numel()));
  }
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' is on ", t.device().str(),
                                                   ", the buffer on ", device.str()));
  }
  return absl::OkStatus();
}

}  // namespace

ParamAndGradBuffer::ParamAndGradBuffer(const layout::PerBufferParamLayout& layout,
                                       const BufferOptions& options)
    : layout_(layout) {
  const int64_t numel = layout_.numel();
  param_data_ = at::zeros(
      {numel},
      at::TensorOptions().dtype(ToScalarType(layout_.key.param_dtype)).device(options.device));
  grad_data_ = at::zeros(
      {numel},
      at::TensorOptions().dtype(ToScalarType(layout_.key.grad_dtype)).device(options.device));
  bucket_params_.resize(layout_.buckets.size());
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    bucket_params_[layout_.params[i].bucket].push_back(static_cast<int>(i));
  }
  for (int b = 0; b < num_buckets(); b += options.buckets_per_group) {
    BucketGroup group;
    for (int j = b; j < std::min(num_buckets(), b + options.buckets_per_group); ++j) {
      group.buckets.push_back(j);
    }
    bucket_groups_.push_back(std::move(group));
  }
}

absl::StatusOr<std::unique_ptr<ParamAndGradBuffer>> ParamAndGradBuffer::Create(
    const layout::PerBufferParamLayout& layout, const std::vector<at::Tensor>& model_params,
    const BufferOptions& options) {
  if (options.buckets_per_group < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("buckets_per_group must be at least 1, got ", options.buckets_per_group));
  }
  RETURN_IF_ERROR(ValidateLayout(layout));
  const at::ScalarType dtype = ToScalarType(layout.key.param_dtype);
  for (const layout::ParamPlacement& p : layout.params) {
    RETURN_IF_ERROR(ValidateParam(p, model_params, dtype, options.device));
  }
  std::unique_ptr<ParamAndGradBuffer> buffer(new ParamAndGradBuffer(layout, options));
  try {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < layout.params.size(); ++i) {
      at::Tensor param = model_params[layout.params[i].param_index];
      at::Tensor param_view = buffer->ParamView(static_cast<int>(i));
      param_view.copy_(param.detach().reshape(param_view.sizes()));
      at::Tensor grad_view = buffer->GradView(static_cast<int>(i));
      if (param.grad().defined()) grad_view.copy_(param.grad().reshape(grad_view.sizes()));
      param_view = param_view.view(param.sizes());
      param.set_data(param_view);
      param.mutable_grad() = grad_view.view(param.sizes());
      buffer->params_.push_back(param);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("buffer ", layout.key.ToString(),
                     ": aliasing params failed: ", e.what_without_backtrace()));
  }
  return buffer;
}

at::Tensor ParamAndGradBuffer::ParamBucket(int bucket) const {
  assert(bucket >= 0 && bucket < num_buckets());
  const layout::Bucket& b = layout_.buckets[bucket];
  return param_data_.narrow(0, b.start, b.numel());
}

at::Tensor ParamAndGradBuffer::GradBucket(int bucket) const {
  assert(bucket >= 0 && bucket < num_buckets());
  const layout::Bucket& b = layout_.buckets[bucket];
  return grad_data_.narrow(0, b.start, b.numel());
}

at::Tensor ParamAndGradBuffer::ParamShard(int bucket, int rank) const {
  assert(rank >= 0 && rank < layout_.dp);
  const auto [begin, end] = layout_.ShardRange(bucket, rank);
  return param_data_.narrow(0, begin, end - begin);
}

at::Tensor ParamAndGradBuffer::GradShard(int bucket, int rank) const {
  assert(rank >= 0 && rank < layout_.dp);
  const auto [begin, end] = layout_.ShardRange(bucket, rank);
  return grad_data_.narrow(0, begin, end - begin);
}

at::Tensor ParamAndGradBuffer::ParamView(int i) const {
  const layout::ParamPlacement& p = layout_.params[i];
  at::Tensor flat = param_data_.narrow(0, p.start, p.numel());
  return params_.size() > static_cast<size_t>(i) ? flat.view(params_[i].sizes()) : flat;
}

at::Tensor ParamAndGradBuffer::GradView(int i) const {
  const layout::ParamPlacement& p = layout_.params[i];
  at::Tensor flat = grad_data_.narrow(0, p.start, p.numel());
  return params_.size() > static_cast<size_t>(i) ? flat.view(params_[i].sizes()) : flat;
}

void ParamAndGradBuffer::ZeroGrads() { grad_data_.zero_(); }

}  // namespace orthoshard::buffers
