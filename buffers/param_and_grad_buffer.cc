#include "buffers/param_and_grad_buffer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
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

namespace {

int64_t StorageBytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// Gives `t`'s storage (which `t` covers from offset 0) fresh memory of the tensor's size; every
// tensor viewing that storage object sees it. Returns the bytes allocated.
int64_t AllocateStorage(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  const int64_t bytes = StorageBytes(t);
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(static_cast<size_t>(bytes));
  return bytes;
}

// Frees the memory of `t`'s storage; the storage object and every view of it stay.
void FreeStorage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

}  // namespace

ParamAndGradBuffer::ParamAndGradBuffer(const layout::PerBufferParamLayout& layout,
                                       const BufferOptions& options)
    : layout_(layout),
      residency_(options.residency),
      rank_(options.rank),
      transient_(options.transient != nullptr ? options.transient
                                              : std::make_shared<TransientMemory>()) {
  const at::TensorOptions param_options =
      at::TensorOptions().dtype(ToScalarType(layout_.key.param_dtype)).device(options.device);
  const at::TensorOptions grad_options =
      at::TensorOptions().dtype(ToScalarType(layout_.key.grad_dtype)).device(options.device);
  if (residency_ == Residency::kFull) {
    param_data_ = at::zeros({layout_.numel()}, param_options);
    grad_data_ = at::zeros({layout_.numel()}, grad_options);
  } else {
    int64_t shard_numel = 0;
    for (const layout::Bucket& bucket : layout_.buckets) {
      shard_offsets_.push_back(shard_numel);
      shard_numel += bucket.shard_size;
      // Created without memory: Create materializes one bucket at a time to alias its params.
      param_buckets_.push_back(at::empty({bucket.numel()}, param_options));
      grad_buckets_.push_back(at::empty({bucket.numel()}, grad_options));
      FreeStorage(param_buckets_.back());
      FreeStorage(grad_buckets_.back());
    }
    param_shards_ = at::zeros({shard_numel}, param_options);
    grad_shards_ = at::zeros({shard_numel}, grad_options);
    params_materialized_.assign(layout_.buckets.size(), false);
    grads_materialized_.assign(layout_.buckets.size(), false);
  }
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

std::pair<int64_t, int64_t> ParamAndGradBuffer::OwnedRange(int i) const {
  const layout::ParamPlacement& p = layout_.params[i];
  const auto [shard_begin, shard_end] = layout_.ShardRange(p.bucket, rank_);
  const int64_t lo = std::max(p.start, shard_begin);
  return {lo, std::max(lo, std::min(p.end, shard_end))};
}

absl::StatusOr<std::unique_ptr<ParamAndGradBuffer>> ParamAndGradBuffer::Create(
    const layout::PerBufferParamLayout& layout, const std::vector<at::Tensor>& model_params,
    const BufferOptions& options) {
  if (options.buckets_per_group < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("buckets_per_group must be at least 1, got ", options.buckets_per_group));
  }
  RETURN_IF_ERROR(ValidateLayout(layout));
  if (options.residency == Residency::kSharded && (options.rank < 0 || options.rank >= layout.dp)) {
    return absl::InvalidArgumentError(absl::StrCat("buffer ", layout.key.ToString(),
                                                   ": sharded residency for rank ", options.rank,
                                                   ", expected a rank in [0, ", layout.dp, ")"));
  }
  const at::ScalarType dtype = ToScalarType(layout.key.param_dtype);
  for (const layout::ParamPlacement& p : layout.params) {
    RETURN_IF_ERROR(ValidateParam(p, model_params, dtype, options.device));
  }
  std::unique_ptr<ParamAndGradBuffer> buffer(new ParamAndGradBuffer(layout, options));
  ParamAndGradBuffer& buf = *buffer;
  try {
    c10::NoGradGuard no_grad;
    buf.params_.resize(layout.params.size());
    // Bucket by bucket, params then grads, so that a sharded buffer never holds more than one
    // full bucket of either here (views of a bucket need its storage while they are made).
    for (int b = 0; b < buf.num_buckets(); ++b) {
      buf.MaterializeParams(b);
      for (int i : buf.BucketParams(b)) {
        at::Tensor param = model_params[layout.params[i].param_index];
        buf.WriteKept(i, param.detach().reshape({-1}), /*grads=*/false);
        param.set_data(buf.ParamView(i).view(param.sizes()));
        buf.params_[i] = param;
      }
      buf.ReleaseParams(b);
      buf.MaterializeGrads(b);
      for (int i : buf.BucketParams(b)) {
        at::Tensor& param = buf.params_[i];
        if (param.grad().defined()) buf.WriteKept(i, param.grad().reshape({-1}), /*grads=*/true);
        param.mutable_grad() = buf.GradView(i).view(param.sizes());
      }
      buf.ReleaseGrads(b);
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
  if (residency_ == Residency::kSharded) return param_buckets_[bucket];
  const layout::Bucket& b = layout_.buckets[bucket];
  return param_data_.narrow(0, b.start, b.numel());
}

at::Tensor ParamAndGradBuffer::GradBucket(int bucket) const {
  assert(bucket >= 0 && bucket < num_buckets());
  if (residency_ == Residency::kSharded) return grad_buckets_[bucket];
  const layout::Bucket& b = layout_.buckets[bucket];
  return grad_data_.narrow(0, b.start, b.numel());
}

at::Tensor ParamAndGradBuffer::ParamShard(int bucket, int rank) const {
  assert(rank >= 0 && rank < layout_.dp);
  const auto [begin, end] = layout_.ShardRange(bucket, rank);
  if (residency_ == Residency::kSharded) {
    assert(rank == rank_);
    return param_shards_.narrow(0, shard_offsets_[bucket], end - begin);
  }
  return param_data_.narrow(0, begin, end - begin);
}

at::Tensor ParamAndGradBuffer::GradShard(int bucket, int rank) const {
  assert(rank >= 0 && rank < layout_.dp);
  const auto [begin, end] = layout_.ShardRange(bucket, rank);
  if (residency_ == Residency::kSharded) {
    assert(rank == rank_);
    return grad_shards_.narrow(0, shard_offsets_[bucket], end - begin);
  }
  return grad_data_.narrow(0, begin, end - begin);
}

at::Tensor ParamAndGradBuffer::ParamView(int i) const {
  const layout::ParamPlacement& p = layout_.params[i];
  const int64_t start = p.start - layout_.buckets[p.bucket].start;
  at::Tensor flat = ParamBucket(p.bucket).narrow(0, start, p.numel());
  return params_.size() > static_cast<size_t>(i) && params_[i].defined()
             ? flat.view(params_[i].sizes())
             : flat;
}

at::Tensor ParamAndGradBuffer::GradView(int i) const {
  const layout::ParamPlacement& p = layout_.params[i];
  const int64_t start = p.start - layout_.buckets[p.bucket].start;
  at::Tensor flat = GradBucket(p.bucket).narrow(0, start, p.numel());
  return params_.size() > static_cast<size_t>(i) && params_[i].defined()
             ? flat.view(params_[i].sizes())
             : flat;
}

void ParamAndGradBuffer::WriteKept(int i, const at::Tensor& flat, bool grads) {
  const layout::ParamPlacement& p = layout_.params[i];
  if (residency_ == Residency::kFull) {
    (grads ? grad_data_ : param_data_).narrow(0, p.start, p.numel()).copy_(flat);
    return;
  }
  // Only the elements in this rank's shard are kept.
  const auto [lo, hi] = OwnedRange(i);
  if (lo == hi) return;
  const int64_t shard_begin = layout_.ShardRange(p.bucket, rank_).first;
  (grads ? GradShard(p.bucket, rank_) : ParamShard(p.bucket, rank_))
      .narrow(0, lo - shard_begin, hi - lo)
      .copy_(flat.narrow(0, lo - p.start, hi - lo));
}

void ParamAndGradBuffer::SetParam(int i, const at::Tensor& value) {
  assert(value.numel() == layout_.params[i].numel());
  c10::NoGradGuard no_grad;
  WriteKept(i, value.detach().reshape({-1}), /*grads=*/false);
}

void ParamAndGradBuffer::MaterializeParams(int bucket) {
  if (residency_ == Residency::kFull || params_materialized_[bucket]) return;
  transient_->Add(AllocateStorage(param_buckets_[bucket]));
  params_materialized_[bucket] = true;
}

void ParamAndGradBuffer::ReleaseParams(int bucket) {
  if (residency_ == Residency::kFull || !params_materialized_[bucket]) return;
  FreeStorage(param_buckets_[bucket]);
  transient_->Remove(StorageBytes(param_buckets_[bucket]));
  params_materialized_[bucket] = false;
}

void ParamAndGradBuffer::MaterializeGrads(int bucket) {
  if (residency_ == Residency::kFull || grads_materialized_[bucket]) return;
  transient_->Add(AllocateStorage(grad_buckets_[bucket]));
  grad_buckets_[bucket].zero_();
  grads_materialized_[bucket] = true;
}

void ParamAndGradBuffer::ReleaseGrads(int bucket) {
  if (residency_ == Residency::kFull || !grads_materialized_[bucket]) return;
  FreeStorage(grad_buckets_[bucket]);
  transient_->Remove(StorageBytes(grad_buckets_[bucket]));
  grads_materialized_[bucket] = false;
}

bool ParamAndGradBuffer::params_materialized(int bucket) const {
  return residency_ == Residency::kFull || params_materialized_[bucket];
}

bool ParamAndGradBuffer::grads_materialized(int bucket) const {
  return residency_ == Residency::kFull || grads_materialized_[bucket];
}

void ParamAndGradBuffer::ZeroGrads() {
  if (residency_ == Residency::kFull) {
    grad_data_.zero_();
    return;
  }
  grad_shards_.zero_();
  for (int b = 0; b < num_buckets(); ++b) {
    if (grads_materialized_[b]) grad_buckets_[b].zero_();
  }
}

BufferMemory ParamAndGradBuffer::memory() const {
  BufferMemory m;
  if (residency_ == Residency::kFull) {
    m.param_bytes = StorageBytes(param_data_);
    m.grad_bytes = StorageBytes(grad_data_);
    return m;
  }
  m.param_bytes = StorageBytes(param_shards_);
  m.grad_bytes = StorageBytes(grad_shards_);
  for (int b = 0; b < num_buckets(); ++b) {
    if (params_materialized_[b]) m.transient_bytes += StorageBytes(param_buckets_[b]);
    if (grads_materialized_[b]) m.transient_bytes += StorageBytes(grad_buckets_[b]);
  }
  return m;
}

}  // namespace orthoshard::buffers
