// DistributedDataParallel with sharded residency (ZeRO-3 / FSDP): which bucket groups to gather
// before a layer's forward and its backward, which to prefetch, and which to release once nothing
// needs them. See "Parameter sharding" in distributed_data_parallel.h. The gathers and releases
// themselves are the bucket groups' (buffers/bucket_group.h: StartParamSync materializes and
// launches, FinishParamSync waits, ReleaseParams frees); the grad sync and the kFull param sync
// are in distributed_data_parallel.cc.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <utility>

#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"

namespace orthoshard::ddp {
absl::Status DistributedDataParallel::PrefetchLayer(int layer) {
  if (!config_.prefetch || layer < 0 || layer >= num_layers_) return absl::OkStatus();
  for (const auto& bg : layer_groups_[layer]) RETURN_IF_ERROR(Ddp(group(bg).StartParamSync()));
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ShardedPreForward(int layer) {
  if (layer == 0) forward_grad_enabled_ = c10::GradMode::is_enabled();
  for (const auto& bg : layer_groups_[layer]) RETURN_IF_ERROR(Ddp(group(bg).FinishParamSync()));
  return PrefetchLayer(layer + 1);
}

absl::Status DistributedDataParallel::ShardedPostForward(int layer, const at::Tensor& output) {
  if (forward_grad_enabled_ && output.defined() && output.requires_grad()) {
    output.register_hook([this, layer](const at::Tensor&) {
      EventLayer scope(this, layer);
      absl::Status status = ShardedPreBackward(layer);
      if (!status.ok()) RecordError(std::move(status));
    });
  }
  // The last layer's backward comes right after the forward: keep its groups.
  const bool keep =
      forward_grad_enabled_ && (!config_.reshard_after_forward || layer == num_layers_ - 1);
  if (keep) return absl::OkStatus();
  for (const auto& [b, g] : layer_groups_[layer]) {
    if (last_reader_[b][g] == layer) RETURN_IF_ERROR(Ddp(group({b, g}).ReleaseParams()));
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ShardedPreBackward(int layer) {
  QueueBackwardCallback();
  for (const auto& bg : layer_groups_[layer]) RETURN_IF_ERROR(Ddp(group(bg).FinishParamSync()));
  return PrefetchLayer(layer - 1);
}

}  // namespace orthoshard::ddp
