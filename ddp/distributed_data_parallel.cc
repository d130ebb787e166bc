#include "ddp/distributed_data_parallel.h"

#include <ATen/ops/mul.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "ddp/internal/group_state.h"

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
  std::unique_ptr<DistributedDataParallel> ddp(new DistributedDataParallel(config));
  RETURN_IF_ERROR(ddp->ValidateAndBuild(layout, params, dense_comm, expert_comm));
  return ddp;
}

absl::Status DistributedDataParallel::ValidateAndBuild(const layout::FullParamLayout& layout,
                                                       const std::vector<at::Tensor>& params,
                                                       Communicator* dense_comm,
                                                       Communicator* expert_comm) {
  if (dense_comm == nullptr) return absl::InvalidArgumentError("ddp: dense_comm is null");
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
  for (const layout::PerBufferParamLayout& buf : layout.buffers) {
    Communicator* comm = buf.key.expert ? expert_comm : dense_comm;
    options.rank = comm->rank();
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(buf, params, options));
    buffers_.push_back(std::move(buffer));
    buffer_comms_.push_back(comm);
  }

  BuildGroups(num_params);
  BuildSequences(dense_comm, expert_comm);
  return HookGradients(params, names);
}

// Groups, and which group every param belongs to.
void DistributedDataParallel::BuildGroups(int num_params) {
  param_group_.assign(num_params, {-1, -1});
  param_placement_.assign(num_params, {-1, -1});
  for (int b = 0; b < num_buffers(); ++b) {
    const std::vector<layout::ParamPlacement>& placed = buffers_[b]->layout().params;
    for (int i = 0; i < static_cast<int>(placed.size()); ++i) {
      param_placement_[placed[i].param_index] = {b, i};
    }
  }
  param_ready_.assign(num_params, false);
  groups_.resize(buffers_.size());
  for (int b = 0; b < num_buffers(); ++b) {
    const buffers::ParamAndGradBuffer& buf = *buffers_[b];
    const std::vector<buffers::BucketGroup>& bucket_groups = buf.bucket_groups();
    for (int g = 0; g < static_cast<int>(bucket_groups.size()); ++g) {
      auto group = std::make_unique<Group>();
      group->buffer = b;
      group->group = g;
      group->min_param_index = num_params;
      for (int bucket : bucket_groups[g].buckets) {
        for (int i : buf.BucketParams(bucket)) {
          const int index = buf.layout().params[i].param_index;
          param_group_[index] = {b, g};
          ++group->expected;
          group->min_param_index = std::min(group->min_param_index, index);
        }
      }
      groups_[b].push_back(std::move(group));
    }
  }
}

// One launch sequence per communicator: a merge of the buffers' groups (each list stays in bucket
// order), picking the head whose earliest param comes latest in forward order.
void DistributedDataParallel::BuildSequences(Communicator* dense_comm, Communicator* expert_comm) {
  std::vector<Communicator*> comms = {dense_comm};
  if (expert_comm != dense_comm) comms.push_back(expert_comm);
  for (Communicator* comm : comms) {
    Sequence seq;
    seq.comm = comm;
    std::vector<int> heads(buffers_.size(), 0);
    while (true) {
      int best = -1;
      for (int b = 0; b < num_buffers(); ++b) {
        if (buffer_comms_[b] != comm || heads[b] >= static_cast<int>(groups_[b].size())) continue;
        if (best < 0 ||
            groups_[b][heads[b]]->min_param_index > groups_[best][heads[best]]->min_param_index) {
          best = b;
        }
      }
      if (best < 0) break;
      Group& group = *groups_[best][heads[best]];
      group.sequence = static_cast<int>(sequences_.size());
      group.position = static_cast<int>(seq.order.size());
      seq.order.push_back({best, heads[best]});
      ++heads[best];
    }
    if (!seq.order.empty()) sequences_.push_back(std::move(seq));
  }
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

std::vector<std::vector<std::pair<int, int>>> DistributedDataParallel::GradReduceOrder() const {
  std::vector<std::vector<std::pair<int, int>>> orders;
  for (const Sequence& seq : sequences_) orders.push_back(seq.order);
  return orders;
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
  for (int bucket : buffers_[b]->bucket_groups()[g].buckets) buffers_[b]->MaterializeGrads(bucket);
}

void DistributedDataParallel::OnGradReady(int param_index) {
  if (sharded()) {
    // Every gradient of the group is in: nothing reads its params again in this backward.
    const auto [b, g] = param_group_[param_index];
    Group& group = *groups_[b][g];
    if (++group.accumulated == group.expected) {
      absl::Status status = ReleaseParams(b, g, -1);
      if (!status.ok()) RecordError(std::move(status));
    }
  }
  if (!is_last_microbatch_) return;
  QueueBackwardCallback();
  if (param_ready_[param_index]) {
    RecordError(absl::FailedPreconditionError(absl::StrCat(
        "ddp: the gradient of param #", param_index,
        " was ready twice in one step (more than one backward in the last micro-batch?)")));
    return;
  }
  param_ready_[param_index] = true;
  const auto [b, g] = param_group_[param_index];
  Group& group = *groups_[b][g];
  ++group.ready;
  if (config_.overlap_grad_reduce && group.ready == group.expected) {
    absl::Status status = LaunchReadyGradReduces(sequences_[group.sequence]);
    if (!status.ok()) RecordError(std::move(status));
  }
}

void DistributedDataParallel::OnBackwardEnded() {
  backward_callback_queued_ = false;
  if (sharded()) {
    // Groups with a param that got no gradient, and prefetches nobody waited on.
    absl::Status status = ReleaseAllParams();
    if (!status.ok()) RecordError(std::move(status));
    for (auto& buffer_groups : groups_) {
      for (auto& group : buffer_groups) group->accumulated = 0;
    }
  }
  if (is_last_microbatch_) Emit(SyncEvent::Kind::kBackwardEnded, -1, -1, -1);
}

absl::Status DistributedDataParallel::LaunchReadyGradReduces(Sequence& seq) {
  while (seq.next_grad_launch < static_cast<int>(seq.order.size())) {
    const auto [b, g] = seq.order[seq.next_grad_launch];
    const Group& group = *groups_[b][g];
    if (group.ready < group.expected) break;
    RETURN_IF_ERROR(LaunchGradReduce(seq, seq.next_grad_launch));
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::LaunchGradReduce(Sequence& seq, int pos) {
  // A param gather still in flight on this communicator is finished first, so the collective order
  // does not depend on how far the forward got.
  if (param_sync_in_flight_) RETURN_IF_ERROR(FinishParamSync());
  // kSharded: at most two reduce-scatters in flight, so that full grads are released as backward
  // goes (their input must live until they finish).
  if (sharded() && pos >= 2) RETURN_IF_ERROR(WaitGroup(seq, pos - 2, /*gather=*/false, -1));
  const auto [b, g] = seq.order[pos];
  buffers::ParamAndGradBuffer& buf = *buffers_[b];
  Group& group = *groups_[b][g];
  const int size = seq.comm->size();
  const int rank = seq.comm->rank();
  const std::vector<int>& buckets = buf.bucket_groups()[g].buckets;
  try {
    c10::NoGradGuard no_grad;
    // A group none of whose params got a gradient this step has no full grads yet: zeros.
    for (int bucket : buckets) buf.MaterializeGrads(bucket);
    // Pre-scale so that the SUM is the mean (Megatron's gradient_scaling_factor).
    if (config_.average_gradients && size > 1) {
      for (int bucket : buckets) buf.GradBucket(bucket).mul_(1.0 / size);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("ddp: scaling the gradients of buffer ", b,
                                            " bucket group ", g,
                                            " failed: ", e.what_without_backtrace()));
  }
  ASSIGN_OR_RETURN(group.work, seq.comm->LaunchGroup(buffers::GradSyncOps(
                                   buf, buckets, config_.grad_sync, collectives::ReduceOp::kSum,
                                   rank)));
  seq.next_grad_launch = pos + 1;
  Emit(SyncEvent::Kind::kGradReduceLaunched, b, g, -1);
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::WaitWork(std::unique_ptr<collectives::Work>& work,
                                               const Sequence& seq, int b, int g, bool gather,
                                               int layer) {
  if (work == nullptr) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Status status = work->Wait(config_.timeout.value_or(seq.comm->timeout()));
  (gather ? waits_.param_gather_s : waits_.grad_sync_s) +=
      absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("ddp: ", gather ? "param all-gather" : "grad reduce-scatter", " of buffer ", b,
                     " (", buffers_[b]->layout().key.ToString(), ") bucket group ", g, " (buckets ",
                     absl::StrJoin(buffers_[b]->bucket_groups()[g].buckets, ","),
                     ") failed: ", status.message()));
  }
  work.reset();
  Emit(gather ? SyncEvent::Kind::kParamGatherWaited : SyncEvent::Kind::kGradReduceWaited, b, g,
       layer);
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::WaitGroup(Sequence& seq, int pos, bool gather, int layer) {
  const auto [b, g] = seq.order[pos];
  Group& group = *groups_[b][g];
  if (group.work == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(WaitWork(group.work, seq, b, g, gather, layer));
  if (sharded() && !gather) ReleaseGrads(b, g);
  return absl::OkStatus();
}

void DistributedDataParallel::ResetGradSyncState() {
  std::fill(param_ready_.begin(), param_ready_.end(), false);
  for (auto& buffer_groups : groups_) {
    for (auto& group : buffer_groups) group->ready = 0;
  }
  for (Sequence& seq : sequences_) seq.next_grad_launch = 0;
}

absl::Status DistributedDataParallel::FinishGradSync() {
  RETURN_IF_ERROR(TakeError());
  if (param_sync_in_flight_) RETURN_IF_ERROR(FinishParamSync());
  for (Sequence& seq : sequences_) {
    while (seq.next_grad_launch < static_cast<int>(seq.order.size())) {
      RETURN_IF_ERROR(LaunchGradReduce(seq, seq.next_grad_launch));
    }
  }
  for (Sequence& seq : sequences_) {
    for (int pos = 0; pos < static_cast<int>(seq.order.size()); ++pos) {
      RETURN_IF_ERROR(WaitGroup(seq, pos, /*gather=*/false, -1));
    }
  }
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
// Param sync. Forward position f of a sequence is backprop position size - 1 - f.

absl::Status DistributedDataParallel::LaunchParamGather(Sequence& seq, int f, int layer) {
  const int pos = static_cast<int>(seq.order.size()) - 1 - f;
  const auto [b, g] = seq.order[pos];
  const buffers::ParamAndGradBuffer& buf = *buffers_[b];
  ASSIGN_OR_RETURN(groups_[b][g]->work,
                   seq.comm->LaunchGroup(buffers::ParamSyncOps(
                       buf, buf.bucket_groups()[g].buckets, seq.comm->rank())));
  seq.next_gather_launch = f + 1;
  Emit(SyncEvent::Kind::kParamGatherLaunched, b, g, layer);
  return absl::OkStatus();
}

int DistributedDataParallel::num_param_sync_stages() const {
  if (config_.grad_sync == buffers::GradSync::kAllReduce || sharded()) return 0;
  int n = 0;
  for (const Sequence& seq : sequences_) n += static_cast<int>(seq.order.size());
  return n;
}

int DistributedDataParallel::ParamSyncStage(int param_index) const {
  if (num_param_sync_stages() == 0 || param_index < 0 ||
      param_index >= static_cast<int>(param_group_.size())) {
    return -1;
  }
  const auto [b, g] = param_group_[param_index];
  const Group& group = *groups_[b][g];
  int stage = 0;
  for (int q = 0; q < group.sequence; ++q) stage += static_cast<int>(sequences_[q].order.size());
  const int n = static_cast<int>(sequences_[group.sequence].order.size());
  return stage + (n - 1 - group.position);  // the forward position
}

absl::Status DistributedDataParallel::BeginParamSync() {
  RETURN_IF_ERROR(TakeError());
  if (num_param_sync_stages() == 0) return absl::OkStatus();
  if (param_sync_in_flight_) RETURN_IF_ERROR(FinishParamSync());
  for (Sequence& seq : sequences_) {
    seq.next_gather_launch = 0;
    seq.next_gather_wait = 0;
  }
  param_sync_in_flight_ = true;
  param_sync_begun_ = true;
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::ParamSyncStageDone(int stage) {
  RETURN_IF_ERROR(TakeError());
  const int num_stages = num_param_sync_stages();
  if (num_stages == 0) return absl::OkStatus();
  if (!param_sync_begun_ || stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ddp: param sync stage ", stage,
        !param_sync_begun_ ? " done before BeginParamSync"
                           : absl::StrCat(" out of range [0, ", num_stages, ")")));
  }
  for (Sequence& seq : sequences_) {
    const int n = static_cast<int>(seq.order.size());
    if (stage < n) {
      // Launch order is forward order on every rank: a stage launches the ones before it too.
      while (seq.next_gather_launch <= stage) {
        RETURN_IF_ERROR(LaunchParamGather(seq, seq.next_gather_launch, -1));
      }
      return absl::OkStatus();
    }
    stage -= n;
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::StartParamSync() {
  RETURN_IF_ERROR(TakeError());
  // Replicated optimizers updated every param on every rank: nothing to gather.
  if (config_.grad_sync == buffers::GradSync::kAllReduce) return absl::OkStatus();
  // Sharded: whatever is still gathered predates the step; the next forward gathers per layer.
  if (sharded()) return ReleaseAllParams();
  if (!param_sync_begun_) RETURN_IF_ERROR(BeginParamSync());
  param_sync_begun_ = false;
  if (!config_.overlap_param_gather) return FinishParamSync();
  for (Sequence& seq : sequences_) {
    if (seq.next_gather_launch == 0 && !seq.order.empty()) {
      RETURN_IF_ERROR(LaunchParamGather(seq, 0, -1));
    }
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::FinishParamSync() {
  RETURN_IF_ERROR(TakeError());
  if (sharded()) {
    for (int b = 0; b < num_buffers(); ++b) {
      for (int g = 0; g < static_cast<int>(groups_[b].size()); ++g) {
        if (groups_[b][g]->params == Group::Params::kInFlight) {
          RETURN_IF_ERROR(EnsureGathered(b, g, -1));
        }
      }
    }
    return absl::OkStatus();
  }
  if (!param_sync_in_flight_) return absl::OkStatus();
  // Cleared first: LaunchGradReduce must not come back here.
  param_sync_in_flight_ = false;
  for (Sequence& seq : sequences_) {
    const int n = static_cast<int>(seq.order.size());
    while (seq.next_gather_launch < n) {
      RETURN_IF_ERROR(LaunchParamGather(seq, seq.next_gather_launch, -1));
    }
    for (; seq.next_gather_wait < n; ++seq.next_gather_wait) {
      RETURN_IF_ERROR(WaitGroup(seq, n - 1 - seq.next_gather_wait, /*gather=*/true, -1));
    }
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::PreForward(int layer) {
  if (!param_sync_in_flight_) return absl::OkStatus();
  for (const auto& [b, g] : layer_groups_[layer]) {
    const Group& group = *groups_[b][g];
    Sequence& seq = sequences_[group.sequence];
    const int n = static_cast<int>(seq.order.size());
    const int f = n - 1 - group.position;
    if (f < seq.next_gather_wait) continue;  // already waited on
    while (seq.next_gather_launch <= f) {
      RETURN_IF_ERROR(LaunchParamGather(seq, seq.next_gather_launch, layer));
    }
    for (; seq.next_gather_wait <= f; ++seq.next_gather_wait) {
      RETURN_IF_ERROR(WaitGroup(seq, n - 1 - seq.next_gather_wait, /*gather=*/true, layer));
    }
    if (seq.next_gather_launch < n) {
      RETURN_IF_ERROR(LaunchParamGather(seq, seq.next_gather_launch, layer));
    }
  }
  bool all_waited = true;
  for (const Sequence& seq : sequences_) {
    all_waited = all_waited && seq.next_gather_wait == static_cast<int>(seq.order.size());
  }
  if (all_waited) param_sync_in_flight_ = false;
  return absl::OkStatus();
}

absl::StatusOr<LayerHooks> DistributedDataParallel::MakeLayerHooks(
    const std::vector<int>& param_layers, const std::vector<std::pair<int, int>>& extra_reads) {
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
  layer_groups_.assign(num_layers, {});
  for (auto& buffer_groups : groups_) {
    for (auto& group : buffer_groups) group->last_reader = -1;
  }
  for (const auto& [param, layer] : reads) {
    std::vector<std::pair<int, int>>& groups = layer_groups_[layer];
    const auto [b, g] = param_group_[param];
    if (std::find(groups.begin(), groups.end(), param_group_[param]) == groups.end()) {
      groups.push_back(param_group_[param]);
    }
    groups_[b][g]->last_reader = std::max(groups_[b][g]->last_reader, layer);
  }
  // Each layer's groups in forward order, so that every rank launches them alike.
  for (std::vector<std::pair<int, int>>& groups : layer_groups_) {
    std::sort(groups.begin(), groups.end(), [this](const auto& x, const auto& y) {
      const Group& a = *groups_[x.first][x.second];
      const Group& b = *groups_[y.first][y.second];
      return std::make_pair(a.sequence, -a.position) < std::make_pair(b.sequence, -b.position);
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
    absl::Status status = sharded() ? ShardedPreForward(layer) : PreForward(layer);
    if (!status.ok()) RecordError(std::move(status));
  };
  hooks.post_forward = [this, check](int layer, const at::Tensor& output) {
    if (!sharded() || !check(layer)) return;
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
