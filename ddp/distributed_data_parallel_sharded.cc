// DistributedDataParallel with sharded residency (ZeRO-3 / FSDP): gathering a layer's bucket groups
// before its forward and its backward, prefetching the next layer's, and releasing gathered params
// and full grads as soon as nothing needs them. See "Parameter sharding" in
// distributed_data_parallel.h; the grad sync and the kFull param sync are in
// distributed_data_parallel.cc.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/internal/group_state.h"

namespace orthoshard::ddp {

// Materializes the group's param buckets and launches their all-gather (this rank's persistent
// shards into the full buckets), unless it is gathered or in flight already.
absl::Status DistributedDataParallel::LaunchGather(int b, int g, int layer) {
  Group& group = *groups_[b][g];
  if (group.params != Group::Params::kReleased) return absl::OkStatus();
  buffers::ParamAndGradBuffer& buf = *buffers_[b];
  const std::vector<int>& buckets = buf.bucket_groups()[g].buckets;
  for (int bucket : buckets) buf.MaterializeParams(bucket);
  Sequence& seq = sequences_[group.sequence];
  ASSIGN_OR_RETURN(group.gather_work,
                   seq.comm->LaunchGroup(buffers::ParamSyncOps(buf, buckets, seq.comm->rank())));
  group.params = Group::Params::kInFlight;
  Emit(SyncEvent::Kind::kParamGatherLaunched, b, g, layer);
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::EnsureGathered(int b, int g, int layer) {
  RETURN_IF_ERROR(LaunchGather(b, g, layer));
  Group& group = *groups_[b][g];
  if (group.params == Group::Params::kInFlight) {
    RETURN_IF_ERROR(
        WaitWork(group.gather_work, sequences_[group.sequence], b, g, /*gather=*/true, layer));
    group.params = Group::Params::kGathered;
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::PrefetchLayer(int layer) {
  if (!config_.prefetch || layer < 0 || layer >= num_layers_) return absl::OkStatus();
  for (const auto& [b, g] : layer_groups_[layer]) RETURN_IF_ERROR(LaunchGather(b, g, layer));
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ReleaseParams(int b, int g, int layer) {
  Group& group = *groups_[b][g];
  if (group.params == Group::Params::kReleased) return absl::OkStatus();
  // Never free memory a collective is still writing.
  if (group.params == Group::Params::kInFlight) {
    RETURN_IF_ERROR(
        WaitWork(group.gather_work, sequences_[group.sequence], b, g, /*gather=*/true, layer));
  }
  for (int bucket : buffers_[b]->bucket_groups()[g].buckets) buffers_[b]->ReleaseParams(bucket);
  group.params = Group::Params::kReleased;
  Emit(SyncEvent::Kind::kParamsReleased, b, g, layer);
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ReleaseAllParams() {
  absl::Status first;
  for (int b = 0; b < num_buffers(); ++b) {
    for (int g = 0; g < static_cast<int>(groups_[b].size()); ++g) {
      absl::Status s = ReleaseParams(b, g, -1);
      if (first.ok() && !s.ok()) first = std::move(s);
    }
  }
  return first;
}

void DistributedDataParallel::ReleaseGrads(int b, int g) {
  bool released = false;
  for (int bucket : buffers_[b]->bucket_groups()[g].buckets) {
    released = released || buffers_[b]->grads_materialized(bucket);
    buffers_[b]->ReleaseGrads(bucket);
  }
  if (released) Emit(SyncEvent::Kind::kGradsReleased, b, g, -1);
}

absl::Status DistributedDataParallel::ShardedPreForward(int layer) {
  if (layer == 0) forward_grad_enabled_ = c10::GradMode::is_enabled();
  for (const auto& [b, g] : layer_groups_[layer]) RETURN_IF_ERROR(EnsureGathered(b, g, layer));
  return PrefetchLayer(layer + 1);
}

absl::Status DistributedDataParallel::ShardedPostForward(int layer, const at::Tensor& output) {
  if (forward_grad_enabled_ && output.defined() && output.requires_grad()) {
    output.register_hook([this, layer](const at::Tensor&) {
      absl::Status status = ShardedPreBackward(layer);
      if (!status.ok()) RecordError(std::move(status));
    });
  }
  // The last layer's backward comes right after the forward: keep its groups.
  const bool keep =
      forward_grad_enabled_ && (!config_.reshard_after_forward || layer == num_layers_ - 1);
  if (keep) return absl::OkStatus();
  for (const auto& [b, g] : layer_groups_[layer]) {
    if (groups_[b][g]->last_reader == layer) RETURN_IF_ERROR(ReleaseParams(b, g, layer));
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ShardedPreBackward(int layer) {
  QueueBackwardCallback();
  for (const auto& [b, g] : layer_groups_[layer]) RETURN_IF_ERROR(EnsureGathered(b, g, layer));
  return PrefetchLayer(layer - 1);
}

}  // namespace orthoshard::ddp
