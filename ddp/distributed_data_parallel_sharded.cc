// DistributedDataParallel with sharded residency (ZeRO-3 / FSDP): which bucket groups to gather
// before a layer's forward and its backward, which to prefetch, and which to release once nothing
// needs them. See "Parameter sharding" in distributed_data_parallel.h. The gathers and releases
// themselves are the bucket groups' (buffers/bucket_group.h: StartParamSync materializes and
// launches, FinishParamSync waits, ReleaseParams frees); the grad sync and the kFull param sync
// are in distributed_data_parallel.cc.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"

namespace orthoshard::ddp {
absl::Status DistributedDataParallel::PrefetchLayer(int layer, bool backward) {
  if (!config_.prefetch || layer < 0 || layer >= num_layers_) return absl::OkStatus();
  if (backward && lookup_layer_[layer]) return absl::OkStatus();
  for (const auto& bg : layer_groups_[layer]) RETURN_IF_ERROR(Ddp(group(bg).StartParamSync()));
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ShardedPreForward(int layer) {
  if (layer == 0) forward_grad_enabled_ = c10::GradMode::is_enabled();
  for (const auto& bg : layer_groups_[layer]) RETURN_IF_ERROR(Ddp(group(bg).FinishParamSync()));
  return PrefetchLayer(layer + 1, /*backward=*/false);
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
  // What the next layer reads is gathered (or being prefetched) already; everything else goes,
  // also a group a later layer reads again (gathered again then).
  return ReleaseUnlessRead(layer, layer + 1);
}

absl::Status DistributedDataParallel::ShardedPreBackward(int layer) {
  QueueBackwardCallback();
  // Layer + 1's backward is done (this hook runs once the gradient of layer's output is complete).
  // A lookup layer reads nothing in backward: every group of layer + 1 goes.
  if (layer + 1 < num_layers_) {
    RETURN_IF_ERROR(ReleaseUnlessRead(layer + 1, lookup_layer_[layer] ? -1 : layer));
  }
  if (!lookup_layer_[layer]) {
    for (const auto& bg : layer_groups_[layer]) RETURN_IF_ERROR(Ddp(group(bg).FinishParamSync()));
  }
  return PrefetchLayer(layer - 1, /*backward=*/true);
}

bool DistributedDataParallel::Reads(int layer, std::pair<int, int> bg) const {
  if (layer < 0 || layer >= num_layers_) return false;
  const std::vector<std::pair<int, int>>& groups = layer_groups_[layer];
  return std::find(groups.begin(), groups.end(), bg) != groups.end();
}

absl::Status DistributedDataParallel::ReleaseUnlessRead(int layer, int next) {
  for (const auto& bg : layer_groups_[layer]) {
    if (!Reads(next, bg)) RETURN_IF_ERROR(Ddp(group(bg).ReleaseParams()));
  }
  return absl::OkStatus();
}

absl::StatusOr<TransientBound> DistributedDataParallel::TransientBoundOf() const {
  if (!sharded() || num_layers_ == 0) {
    return absl::FailedPreconditionError(
        "ddp: the transient bound needs sharded residency and the layers of MakeLayerHooks");
  }
  auto bytes = [this](std::pair<int, int> bg, bool grads) {
    int64_t n = 0;
    const buffers::ParamAndGradBuffer& buf = *buffers_[bg.first];
    for (int bucket : buf.bucket_groups()[bg.second].buckets) {
      const at::Tensor t = grads ? buf.GradBucket(bucket) : buf.ParamBucket(bucket);
      n += t.numel() * static_cast<int64_t>(t.element_size());
    }
    return n;
  };
  // Bytes of the union of the groups that `in(layer, bg)` selects for layers L and L + 1.
  auto pair_bytes = [&](int layer, bool grads, const auto& in) {
    int64_t n = 0;
    for (int b = 0; b < num_buffers(); ++b) {
      for (int g = 0; g < sync_->num_groups(b); ++g) {
        if (in(layer, {b, g}) || (layer + 1 < num_layers_ && in(layer + 1, {b, g}))) {
          n += bytes({b, g}, grads);
        }
      }
    }
    return n;
  };
  auto spans = [this](int layer, std::pair<int, int> bg) {
    const auto [lo, hi] = own_layers_[bg.first][bg.second];
    return lo <= layer && layer <= hi;
  };
  auto reads = [this](int layer, std::pair<int, int> bg) { return Reads(layer, bg); };
  TransientBound bound;
  int64_t max_group_grads = 0;
  for (int b = 0; b < num_buffers(); ++b) {
    for (int g = 0; g < sync_->num_groups(b); ++g) {
      max_group_grads = std::max(max_group_grads, bytes({b, g}, true));
    }
  }
  for (int layer = 0; layer < num_layers_; ++layer) {
    bound.params = std::max(bound.params, pair_bytes(layer, false, reads));
    bound.grads = std::max(bound.grads, pair_bytes(layer, true, spans));
  }
  bound.grad_syncs = int64_t{config_.grad_syncs_in_flight} * max_group_grads;
  return bound;
}

}  // namespace orthoshard::ddp
