#include "ddp/distributed_data_parallel.h"

#include <ATen/ops/mul.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::ddp {

using collectives::Communicator;

const char* SyncEventKindName(SyncEvent::Kind kind) {
  switch (kind) {
    case SyncEvent::Kind::kGradReduceLaunched:
      return "grad_reduce_launched";
    case SyncEvent::Kind::kGradReduceWaited:
      return "grad_reduce_waited";
    case SyncEvent::Kind::kParamGatherLaunched:
      return "param_gather_launched";
    case SyncEvent::Kind::kParamGatherWaited:
      return "param_gather_waited";
    case SyncEvent::Kind::kBackwardEnded:
      return "backward_ended";
    case SyncEvent::Kind::kParamsReleased:
      return "params_released";
    case SyncEvent::Kind::kGradsReleased:
      return "grads_released";
  }
  return "unknown";
}

// Runs after AccumulateGrad added a param's gradient into its `.grad` view of grad_data.
class DistributedDataParallel::GradHook : public torch::autograd::FunctionPostHook {
 public:
  GradHook(DistributedDataParallel* ddp, int param_index) : ddp_(ddp), param_index_(param_index) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    ddp_->OnGradReady(param_index_);
    return outputs;
  }

 private:
  DistributedDataParallel* ddp_;
  int param_index_;
};

absl::Status DistributedDataParallel::Ddp(absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("ddp: ", status.message()));
}

DistributedDataParallel::DistributedDataParallel(const DdpConfig& config)
    : config_(config), transient_(std::make_shared<buffers::TransientMemory>()) {}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) {
    std::static_pointer_cast<torch::autograd::Node>(grad_accumulators_[i])
        ->del_post_hook(hook_keys_[i]);
  }
  for (size_t i = 0; i < pre_hook_keys_.size(); ++i)
    hooked_params_[i].remove_hook(pre_hook_keys_[i]);
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::Create(
    const layout::FullParamLayout& layout, const std::vector<at::Tensor>& params,
    Communicator* dense_comm, Communicator* expert_comm, const DdpConfig& config) {
  if (config.buckets_per_group < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ddp: buckets_per_group must be at least 1, got ", config.buckets_per_group));
  }
  if (config.grad_syncs_in_flight < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ddp: grad_syncs_in_flight must be >= 0, got ",
                                                   config.grad_syncs_in_flight));
  }
  std::unique_ptr<DistributedDataParallel> ddp(new DistributedDataParallel(config));
  RETURN_IF_ERROR(ddp->ValidateAndBuild(layout, params, dense_comm, expert_comm));
  return ddp;
}

absl::Status DistributedDataParallel::ValidateAndBuild(const layout::FullParamLayout& layout,
                                                       const std::vector<at::Tensor>& params,
                                                       Communicator* dense_comm,
                                                       Communicator* expert_comm) {
  if (dense_comm == nullptr) return absl::InvalidArgumentError("ddp: dense_comm is null");
  if (sharded_accumulation() && !sharded()) {
    return absl::InvalidArgumentError(
        "ddp: sharded grad accumulation adds each micro-batch's reduce-scatter into this rank's "
        "grad shards: it needs sharded residency (with full residency the grads are whole)");
  }
  if (sharded() && config_.grad_sync != buffers::GradSync::kReduceScatter) {
    return absl::InvalidArgumentError(
        "ddp: sharded residency keeps only this rank's shard of each gradient: it needs the "
        "reduce-scatter grad sync, not the all-reduce of replicated optimizers");
  }
  if (expert_comm == nullptr) expert_comm = dense_comm;
  if (expert_comm->device() != dense_comm->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ddp: the expert communicator reduces on ", expert_comm->device().str(),
                     ", the dense one on ", dense_comm->device().str(), "; expected one device"));
  }
  const int num_params = static_cast<int>(params.size());
  std::vector<int> placed(num_params, 0);
  std::vector<std::string> names(num_params);
  for (const layout::PerBufferParamLayout& buf : layout.buffers) {
    for (const layout::ParamPlacement& p : buf.params) {
      if (p.param_index < 0 || p.param_index >= num_params) {
        return absl::InvalidArgumentError(absl::StrCat("ddp: param '", p.name, "' has index ",
                                                       p.param_index, ", expected [0, ", num_params,
                                                       ") (the number of params given)"));
      }
      ++placed[p.param_index];
      names[p.param_index] = p.name;
    }
  }
  for (int i = 0; i < num_params; ++i) {
    if (placed[i] != 1) {
      return absl::InvalidArgumentError(absl::StrCat("ddp: param #", i, " ('", names[i],
                                                     "') is placed in ", placed[i],
                                                     " buffers, expected exactly 1"));
    }
    if (!params[i].defined() || !params[i].requires_grad() || !params[i].is_leaf()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ddp: param '", names[i], "' must be a defined leaf tensor with requires_grad"));
    }
  }
  for (const layout::PerBufferParamLayout& buf : layout.buffers) {
    Communicator* comm = buf.key.expert ? expert_comm : dense_comm;
    if (comm->size() != buf.dp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ddp: buffer ", buf.key.ToString(), " is planned for dp ", buf.dp, " but its ",
          buf.key.expert ? "expert" : "dense", " communicator has ", comm->size(), " ranks"));
    }
    if (config_.grad_reduce_in_fp32 && buf.key.grad_dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat("ddp: grad_reduce_in_fp32 needs fp32 grad buffers, but buffer ",
                       buf.key.ToString(), " has grad dtype ", DTypeName(buf.key.grad_dtype),
                       " (plan the layout with LayoutOptions::grad_dtype = kFloat32)"));
    }
  }
  buffers::BufferOptions options;
  options.buckets_per_group = config_.buckets_per_group;
  // The buffers live where the communicator reduces (CPU for Gloo, this rank's GPU for NCCL); the
  // params must already be there (ParamAndGradBuffer::Create names any that is not).
  options.device = dense_comm->device();
  options.residency = config_.residency;
  options.transient = transient_;
  std::vector<Communicator*> comms;  // parallel to buffers_
  for (const layout::PerBufferParamLayout& buf : layout.buffers) {
    Communicator* comm = buf.key.expert ? expert_comm : dense_comm;
    options.rank = comm->rank();
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(buf, params, options));
    buffers_.push_back(std::move(buffer));
    comms.push_back(comm);
  }
  RETURN_IF_ERROR(BuildSync(comms, num_params, dense_comm->size()));
  return HookGradients(params, names);
}

// The bucket groups (dense buffers chained apart from expert ones when their communicators
// differ), and which group every param belongs to.
absl::Status DistributedDataParallel::BuildSync(const std::vector<Communicator*>& comms,
                                                int num_params, int dense_ranks) {
  buffers::BucketGroupOptions options;
  options.grad_sync = config_.grad_sync;
  options.average_gradients = config_.average_gradients;
  options.average_over = dense_ranks;  // experts too (BucketGroupOptions::average_over)
  options.overlap_grad_reduce = config_.overlap_grad_reduce;
  options.overlap_param_gather = config_.overlap_param_gather;
  options.grad_syncs_in_flight = config_.grad_syncs_in_flight;
  options.timeout = config_.timeout;
  options.on_event = [this](const buffers::BucketGroupEvent& e) { OnSyncEvent(e); };
  std::vector<buffers::ParamAndGradBuffer*> raw;
  for (auto& buffer : buffers_) raw.push_back(buffer.get());
  ASSIGN_OR_RETURN(sync_, buffers::BucketGroupSync::Create(std::move(raw), comms,
                                                           std::move(options)));
  param_group_.assign(num_params, {-1, -1});
  param_placement_.assign(num_params, {-1, -1});
  param_ready_.assign(num_params, false);
  for (int b = 0; b < num_buffers(); ++b) {
    const std::vector<layout::ParamPlacement>& placed = buffers_[b]->layout().params;
    for (int i = 0; i < static_cast<int>(placed.size()); ++i) {
      param_placement_[placed[i].param_index] = {b, i};
      param_group_[placed[i].param_index] = {b, sync_->GroupOfBucket(b, placed[i].bucket)};
    }
    accumulated_.emplace_back(sync_->num_groups(b), 0);
    own_layers_.emplace_back(sync_->num_groups(b), std::make_pair(-1, -1));
  }
  return absl::OkStatus();
}

// Gradient hooks on every param's AccumulateGrad node (as c10d's reducer.cpp). The tensor holds its
// accumulator weakly, so keep it alive here.
absl::Status DistributedDataParallel::HookGradients(const std::vector<at::Tensor>& params,
                                                    const std::vector<std::string>& names) {
  const int num_params = static_cast<int>(params.size());
  try {
    for (int i = 0; i < num_params; ++i) {
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(params[i]);
      if (accumulator == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("ddp: param '", names[i], "' has no gradient accumulator"));
      }
      hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<GradHook>(this, i)));
      grad_accumulators_.push_back(std::move(accumulator));
      if (sharded()) {
        // Runs before AccumulateGrad adds into `.grad`, whose full bucket may be released.
        pre_hook_keys_.push_back(
            params[i].register_hook([this, i](const at::Tensor&) { OnGradAboutToAccumulate(i); }));
        hooked_params_.push_back(params[i]);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("ddp: hooking gradient accumulators failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

void DistributedDataParallel::OnSyncEvent(const buffers::BucketGroupEvent& e) {
  using In = buffers::BucketGroupEvent::Kind;
  using Out = SyncEvent::Kind;
  Out kind = Out::kGradReduceLaunched;
  switch (e.kind) {
    case In::kGradSyncLaunched:
      kind = Out::kGradReduceLaunched;
      break;
    case In::kGradSyncWaited:
      kind = Out::kGradReduceWaited;
      waits_.grad_sync_s += e.wait_s;
      break;
    case In::kParamSyncLaunched:
      kind = Out::kParamGatherLaunched;
      break;
    case In::kParamSyncWaited:
      kind = Out::kParamGatherWaited;
      waits_.param_gather_s += e.wait_s;
      break;
    case In::kParamsReleased:
      kind = Out::kParamsReleased;
      break;
    case In::kGradsReleased:
      kind = Out::kGradsReleased;
      break;
  }
  Emit(kind, e.buffer, e.group, event_layer_);
}

void DistributedDataParallel::Emit(SyncEvent::Kind kind, int buffer, int group, int layer) {
  if (config_.on_event) config_.on_event(SyncEvent{kind, buffer, group, layer});
}

void DistributedDataParallel::RecordError(absl::Status status) {
  if (pending_error_.ok()) pending_error_ = std::move(status);
}

absl::Status DistributedDataParallel::TakeError() {
  absl::Status status = std::move(pending_error_);
  pending_error_ = absl::OkStatus();
  return status;
}

// ---------------------------------------------------------------------------------------------
// Grad sync.

void DistributedDataParallel::QueueBackwardCallback() {
  if (backward_callback_queued_) return;
  backward_callback_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { OnBackwardEnded(); });
}

void DistributedDataParallel::OnGradAboutToAccumulate(int param_index) {
  QueueBackwardCallback();
  const auto [b, g] = param_group_[param_index];
  const std::vector<int>& buckets = buffers_[b]->bucket_groups()[g].buckets;
  if (!std::all_of(buckets.begin(), buckets.end(),
                   [&](int bucket) { return buffers_[b]->grads_materialized(bucket); })) {
    absl::Status status = Ddp(sync_->LimitGradSyncsInFlight());
    if (!status.ok()) RecordError(std::move(status));
  }
  for (int bucket : buckets) buffers_[b]->MaterializeGrads(bucket);
}

void DistributedDataParallel::OnGradReady(int param_index) {
  const auto [b, g] = param_group_[param_index];
  if (sharded()) {
    // Every gradient of the group is in: nothing reads its params again in this backward.
    if (++accumulated_[b][g] == group({b, g}).num_params()) {
      absl::Status status = Ddp(group({b, g}).ReleaseParams());
      if (!status.ok()) RecordError(std::move(status));
    }
  }
  if (!communicates()) return;
  QueueBackwardCallback();
  if (param_ready_[param_index]) {
    RecordError(absl::FailedPreconditionError(absl::StrCat(
        "ddp: the gradient of param #", param_index,
        " was ready twice in one step (more than one backward in the last micro-batch?)")));
    return;
  }
  param_ready_[param_index] = true;
  absl::Status status = Ddp(sync_->RegisterGradReady(b, g));
  if (!status.ok()) RecordError(std::move(status));
}

void DistributedDataParallel::OnBackwardEnded() {
  backward_callback_queued_ = false;
  if (sharded()) {
    // Groups with a param that got no gradient, and prefetches nobody waited on.
    absl::Status status = Ddp(sync_->ReleaseAllParams());
    if (!status.ok()) RecordError(std::move(status));
    for (std::vector<int>& counts : accumulated_) std::fill(counts.begin(), counts.end(), 0);
  }
  if (sharded_accumulation() && !is_last_microbatch_) {
    // Reduce this micro-batch now, so that no full grads outlive its backward; the next one adds
    // into the shards.
    absl::Status status = Ddp(sync_->FinishGradSync());
    if (!status.ok()) RecordError(std::move(status));
    std::fill(param_ready_.begin(), param_ready_.end(), false);
    sync_->set_accumulate_grad_shards(true);
  }
  if (is_last_microbatch_) Emit(SyncEvent::Kind::kBackwardEnded, -1, -1, -1);
}

void DistributedDataParallel::ResetGradSyncState() {
  std::fill(param_ready_.begin(), param_ready_.end(), false);
  sync_->ResetGradSync();
  sync_->set_accumulate_grad_shards(false);
}

absl::Status DistributedDataParallel::FinishGradSync() {
  RETURN_IF_ERROR(TakeError());
  RETURN_IF_ERROR(Ddp(sync_->FinishGradSync()));
  ResetGradSyncState();
  return absl::OkStatus();
}

void DistributedDataParallel::ZeroGradBuffers() {
  for (auto& buffer : buffers_) buffer->ZeroGrads();
  ResetGradSyncState();
}

absl::Status DistributedDataParallel::SetParam(int param_index, const at::Tensor& value) {
  if (param_index < 0 || param_index >= static_cast<int>(param_placement_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ddp: SetParam of param #", param_index, ", expected [0, ", param_placement_.size(), ")"));
  }
  const auto [b, i] = param_placement_[param_index];
  const layout::ParamPlacement& p = buffers_[b]->layout().params[i];
  if (!value.defined() || value.numel() != p.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("ddp: SetParam of '", p.name, "' with ",
                                                   value.defined() ? value.numel() : 0,
                                                   " elements, the param has ", p.numel()));
  }
  try {
    buffers_[b]->SetParam(i, value);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("ddp: SetParam of '", p.name, "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

DdpMemory DistributedDataParallel::memory() const {
  DdpMemory m;
  for (const auto& buffer : buffers_) {
    const buffers::BufferMemory b = buffer->memory();
    m.param_bytes += b.param_bytes;
    m.grad_bytes += b.grad_bytes;
    m.transient_bytes += b.transient_bytes;
  }
  m.peak_transient_bytes = transient_->peak();
  return m;
}

void DistributedDataParallel::ResetPeakMemory() { transient_->ResetPeak(); }

// ---------------------------------------------------------------------------------------------
// Param sync: the bucket groups' (buffers/bucket_group.h); the hooks ask them per layer.

absl::Status DistributedDataParallel::FinishParamSync() {
  RETURN_IF_ERROR(TakeError());
  return Ddp(sync_->FinishParamSync());
}

absl::Status DistributedDataParallel::PreForward(int layer) {
  for (const auto& [b, g] : layer_groups_[layer]) {
    RETURN_IF_ERROR(Ddp(sync_->FinishParamSyncFor(b, g)));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerHooks> DistributedDataParallel::MakeLayerHooks(
    const std::vector<int>& param_layers, const std::vector<std::pair<int, int>>& extra_reads,
    const std::vector<int>& lookup_layers) {
  if (param_layers.size() != param_group_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ddp: layer hooks got layers for ",
                                                   param_layers.size(), " params, expected ",
                                                   param_group_.size()));
  }
  int num_layers = 0;
  for (size_t i = 0; i < param_layers.size(); ++i) {
    if (param_layers[i] < 0 || (i > 0 && param_layers[i] < param_layers[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("ddp: layer hooks: param #", i, " has layer ", param_layers[i],
                       ", expected a layer >= ", i > 0 ? param_layers[i - 1] : 0,
                       " (layers are non-negative and non-decreasing in param order)"));
    }
    num_layers = std::max(num_layers, param_layers[i] + 1);
  }
  std::vector<std::pair<int, int>> reads;  // (param, layer)
  for (size_t i = 0; i < param_layers.size(); ++i)
    reads.push_back({static_cast<int>(i), param_layers[i]});
  for (const auto& [param, layer] : extra_reads) {
    if (param < 0 || param >= static_cast<int>(param_layers.size()) || layer < 0 ||
        layer >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("ddp: layer hooks: extra read of param #", param, " by layer ", layer,
                       ", expected a param in [0, ", param_layers.size(), ") and a layer in [0, ",
                       num_layers, ")"));
    }
    reads.push_back({param, layer});
  }
  lookup_layer_.assign(num_layers, false);
  for (int layer : lookup_layers) {
    if (layer < 0 || layer >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("ddp: layer hooks: lookup layer ", layer,
                                                     ", expected a layer in [0, ", num_layers,
                                                     ")"));
    }
    lookup_layer_[layer] = true;
  }
  layer_groups_.assign(num_layers, {});
  for (auto& ranges : own_layers_) std::fill(ranges.begin(), ranges.end(), std::make_pair(-1, -1));
  for (const auto& [param, layer] : reads) {
    std::vector<std::pair<int, int>>& groups = layer_groups_[layer];
    if (std::find(groups.begin(), groups.end(), param_group_[param]) == groups.end()) {
      groups.push_back(param_group_[param]);
    }
  }
  for (size_t i = 0; i < param_layers.size(); ++i) {
    const auto [b, g] = param_group_[i];
    std::pair<int, int>& range = own_layers_[b][g];
    range.first = range.first < 0 ? param_layers[i] : std::min(range.first, param_layers[i]);
    range.second = std::max(range.second, param_layers[i]);
  }
  // Each layer's groups in forward order (chain by chain), so that every rank launches them alike.
  for (std::vector<std::pair<int, int>>& groups : layer_groups_) {
    std::sort(groups.begin(), groups.end(), [this](const auto& x, const auto& y) {
      const auto [cx, px] = sync_->ChainPosition(x.first, x.second);
      const auto [cy, py] = sync_->ChainPosition(y.first, y.second);
      return std::make_pair(cx, -px) < std::make_pair(cy, -py);
    });
  }
  num_layers_ = num_layers;
  auto check = [this, num_layers](int layer) {
    if (layer >= 0 && layer < num_layers) return true;
    RecordError(absl::InvalidArgumentError(absl::StrCat("ddp: layer hook called for layer ", layer,
                                                        ", expected [0, ", num_layers, ")")));
    return false;
  };
  LayerHooks hooks;
  hooks.pre_forward = [this, check](int layer) {
    if (!check(layer)) return;
    EventLayer scope(this, layer);
    absl::Status status = sharded() ? ShardedPreForward(layer) : PreForward(layer);
    if (!status.ok()) RecordError(std::move(status));
  };
  hooks.post_forward = [this, check](int layer, const at::Tensor& output) {
    if (!sharded() || !check(layer)) return;
    EventLayer scope(this, layer);
    absl::Status status = ShardedPostForward(layer, output);
    if (!status.ok()) RecordError(std::move(status));
  };
  return hooks;
}

absl::StatusOr<std::function<void(int layer)>> DistributedDataParallel::PreForwardHook(
    const std::vector<int>& param_layers) {
  ASSIGN_OR_RETURN(LayerHooks hooks, MakeLayerHooks(param_layers));
  return std::move(hooks.pre_forward);
}

}  // namespace orthoshard::ddp
