#include "buffers/bucket_group.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace orthoshard::buffers {

using Kind = BucketGroupEvent::Kind;

// ---------------------------------------------------------------------------------------------
// One group.

ParamAndGradBucketGroup::ParamAndGradBucketGroup(ParamAndGradBuffer* buffer, int buffer_index,
                                                 int group, collectives::Communicator* comm,
                                                 const BucketGroupOptions* options)
    : buffer_(buffer),
      buffer_index_(buffer_index),
      group_(group),
      comm_(comm),
      options_(options) {
  min_param_index_ = -1;
  for (int bucket : buckets()) {
    for (int i : buffer_->BucketParams(bucket)) {
      const int index = buffer_->layout().params[i].param_index;
      ++num_params_;
      if (min_param_index_ < 0 || index < min_param_index_) min_param_index_ = index;
    }
  }
  if (buffer_->residency() == Residency::kSharded) param_state_ = ParamState::kStale;
}

std::string ParamAndGradBucketGroup::Name() const {
  return absl::StrCat("buffer ", buffer_index_, " (", buffer_->layout().key.ToString(),
                      ") bucket group ", group_, " (buckets ", absl::StrJoin(buckets(), ","), ")");
}

const char* ParamAndGradBucketGroup::GradCollective() const {
  return options_->grad_sync == GradSync::kReduceScatter ? "grad reduce-scatter"
                                                         : "grad all-reduce";
}

void ParamAndGradBucketGroup::Emit(Kind kind, double wait_s) const {
  if (options_->on_event) options_->on_event(BucketGroupEvent{kind, buffer_index_, group_, wait_s});
}

bool ParamAndGradBucketGroup::RegisterGradReady() {
  ++ready_;
  return grads_ready();
}

absl::Status ParamAndGradBucketGroup::StartGradSync(bool accumulate) {
  assert(grad_state_ == GradState::kNotStarted);
  const int size = comm_->size();
  try {
    c10::NoGradGuard no_grad;
    // A group none of whose params got a gradient this step has no full grads yet: zeros.
    for (int bucket : buckets()) buffer_->MaterializeGrads(bucket);
    // Pre-scale so that the SUM is the mean (Megatron's gradient_scaling_factor).
    const int over = options_->average_over > 0 ? options_->average_over : size;
    if (options_->average_gradients && over > 1) {
      for (int bucket : buckets()) buffer_->GradBucket(bucket).mul_(1.0 / over);
    }
    if (accumulate && buffer_->residency() == Residency::kSharded &&
        options_->grad_sync == GradSync::kReduceScatter) {
      const int rank = comm_->rank();
      for (int bucket : buckets()) {
        const int64_t shard = buffer_->layout().buckets[bucket].shard_size;
        buffer_->GradBucket(bucket).narrow(0, rank * shard, shard).add_(
            buffer_->GradShard(bucket, rank));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("scaling the gradients of ", Name(),
                                            " failed: ", e.what_without_backtrace()));
  }
  absl::StatusOr<std::unique_ptr<collectives::Work>> work = comm_->LaunchGroup(GradSyncOps(
      *buffer_, buckets(), options_->grad_sync, collectives::ReduceOp::kSum, comm_->rank()));
  if (!work.ok()) {
    return absl::Status(work.status().code(),
                        absl::StrCat("launching the ", GradCollective(), " of ", Name(),
                                     " failed: ", work.status().message()));
  }
  grad_work_ = *std::move(work);
  grad_state_ = GradState::kInFlight;
  Emit(Kind::kGradSyncLaunched);
  return absl::OkStatus();
}

absl::Status ParamAndGradBucketGroup::Wait(std::unique_ptr<collectives::Work>& work, bool gather) {
  const absl::Time start = absl::Now();
  const absl::Status status = work->Wait(options_->timeout.value_or(comm_->timeout()));
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat(gather ? "param all-gather" : GradCollective(), " of ",
                                     Name(), " failed: ", status.message()));
  }
  work.reset();
  Emit(gather ? Kind::kParamSyncWaited : Kind::kGradSyncWaited, waited);
  return absl::OkStatus();
}

absl::Status ParamAndGradBucketGroup::FinishGradSync() {
  if (grad_state_ != GradState::kInFlight) return absl::OkStatus();
  RETURN_IF_ERROR(Wait(grad_work_, /*gather=*/false));
  grad_state_ = GradState::kFinished;
  if (buffer_->residency() == Residency::kSharded) {
    bool released = false;
    for (int bucket : buckets()) {
      released = released || buffer_->grads_materialized(bucket);
      buffer_->ReleaseGrads(bucket);
    }
    if (released) Emit(Kind::kGradsReleased);
  }
  return absl::OkStatus();
}

void ParamAndGradBucketGroup::ResetGradSync() {
  assert(grad_state_ != GradState::kInFlight);
  ready_ = 0;
  grad_state_ = GradState::kNotStarted;
}

void ParamAndGradBucketGroup::MarkParamsStale() {
  if (param_state_ == ParamState::kSynced) param_state_ = ParamState::kStale;
}

absl::Status ParamAndGradBucketGroup::StartParamSync() {
  if (param_state_ != ParamState::kStale) return absl::OkStatus();
  for (int bucket : buckets()) buffer_->MaterializeParams(bucket);
  absl::StatusOr<std::unique_ptr<collectives::Work>> work =
      comm_->LaunchGroup(ParamSyncOps(*buffer_, buckets(), comm_->rank()));
  if (!work.ok()) {
    return absl::Status(work.status().code(),
                        absl::StrCat("launching the param all-gather of ", Name(),
                                     " failed: ", work.status().message()));
  }
  param_work_ = *std::move(work);
  param_state_ = ParamState::kInFlight;
  Emit(Kind::kParamSyncLaunched);
  return absl::OkStatus();
}

absl::Status ParamAndGradBucketGroup::FinishParamSync() {
  RETURN_IF_ERROR(StartParamSync());
  if (param_state_ == ParamState::kInFlight) {
    RETURN_IF_ERROR(Wait(param_work_, /*gather=*/true));
    param_state_ = ParamState::kSynced;
  }
  return absl::OkStatus();
}

absl::Status ParamAndGradBucketGroup::ReleaseParams() {
  if (buffer_->residency() != Residency::kSharded || param_state_ == ParamState::kStale) {
    return absl::OkStatus();
  }
  // Never free memory a collective is still writing.
  if (param_state_ == ParamState::kInFlight) RETURN_IF_ERROR(Wait(param_work_, /*gather=*/true));
  for (int bucket : buckets()) buffer_->ReleaseParams(bucket);
  param_state_ = ParamState::kStale;
  Emit(Kind::kParamsReleased);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The groups of a model and their chains.

absl::StatusOr<std::unique_ptr<BucketGroupSync>> BucketGroupSync::Create(
    std::vector<ParamAndGradBuffer*> buffers, std::vector<collectives::Communicator*> comms,
    BucketGroupOptions options) {
  if (buffers.size() != comms.size()) {
    return absl::InvalidArgumentError(absl::StrCat("bucket groups: ", buffers.size(),
                                                   " buffers but ", comms.size(),
                                                   " communicators, expected one per buffer"));
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (buffers[b] == nullptr || comms[b] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket groups: buffer ", b, " or its communicator is null"));
    }
    const layout::PerBufferParamLayout& layout = buffers[b]->layout();
    if (comms[b]->size() != layout.dp) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket groups: buffer ", b, " (", layout.key.ToString(),
                       ") is laid out for dp ", layout.dp, ", its communicator has ",
                       comms[b]->size(), " ranks"));
    }
    if (buffers[b]->residency() != buffers[0]->residency()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket groups: buffer ", b, " (", layout.key.ToString(),
          ") has another residency than buffer 0; expected one residency for all"));
    }
    if (buffers[b]->residency() == Residency::kSharded &&
        options.grad_sync != GradSync::kReduceScatter) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket groups: buffer ", b, " (", layout.key.ToString(),
          ") keeps only this rank's shards (sharded residency): it needs the reduce-scatter grad "
          "sync, not the all-reduce"));
    }
  }
  if (options.grad_syncs_in_flight < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucket groups: grad_syncs_in_flight is ",
                                                   options.grad_syncs_in_flight,
                                                   ", expected >= 0"));
  }
  std::unique_ptr<BucketGroupSync> sync(new BucketGroupSync(std::move(options)));
  sync->buffers_ = std::move(buffers);
  int flat = 0;
  for (int b = 0; b < sync->num_buffers(); ++b) {
    ParamAndGradBuffer* buffer = sync->buffers_[b];
    sync->group_offset_.push_back(flat);
    sync->groups_.emplace_back();
    sync->group_of_bucket_.emplace_back(buffer->num_buckets(), -1);
    for (int g = 0; g < static_cast<int>(buffer->bucket_groups().size()); ++g, ++flat) {
      sync->groups_[b].push_back(
          std::make_unique<ParamAndGradBucketGroup>(buffer, b, g, comms[b], &sync->options_));
      for (int bucket : buffer->bucket_groups()[g].buckets) sync->group_of_bucket_[b][bucket] = g;
    }
  }
  sync->chain_position_.assign(flat, {-1, -1});
  sync->BuildChains(comms);
  return sync;
}

// One chain per communicator: a merge of its buffers' groups (each list stays in bucket order),
// picking the head whose earliest param comes latest in forward order.
void BucketGroupSync::BuildChains(const std::vector<collectives::Communicator*>& comms) {
  std::vector<collectives::Communicator*> distinct;
  for (collectives::Communicator* comm : comms) {
    if (std::find(distinct.begin(), distinct.end(), comm) == distinct.end()) {
      distinct.push_back(comm);
    }
  }
  for (collectives::Communicator* comm : distinct) {
    Chain chain;
    chain.comm = comm;
    std::vector<int> heads(buffers_.size(), 0);
    while (true) {
      int best = -1;
      for (int b = 0; b < num_buffers(); ++b) {
        if (comms[b] != comm || heads[b] >= num_groups(b)) continue;
        if (best < 0 || groups_[b][heads[b]]->min_param_index() >
                            groups_[best][heads[best]]->min_param_index()) {
          best = b;
        }
      }
      if (best < 0) break;
      chain_position_[group_offset_[best] + heads[best]] = {static_cast<int>(chains_.size()),
                                                           static_cast<int>(chain.order.size())};
      chain.order.push_back(groups_[best][heads[best]].get());
      ++heads[best];
    }
    if (!chain.order.empty()) chains_.push_back(std::move(chain));
  }
}

int BucketGroupSync::BufferIndex(const ParamAndGradBuffer* buffer) const {
  const auto it = std::find(buffers_.begin(), buffers_.end(), buffer);
  return it == buffers_.end() ? -1 : static_cast<int>(it - buffers_.begin());
}

std::vector<std::vector<std::pair<int, int>>> BucketGroupSync::GradSyncOrder() const {
  std::vector<std::vector<std::pair<int, int>>> orders;
  for (const Chain& chain : chains_) {
    orders.emplace_back();
    for (const ParamAndGradBucketGroup* g : chain.order) {
      orders.back().push_back({g->buffer_index(), g->group()});
    }
  }
  return orders;
}

// ---- Grad sync.

absl::Status BucketGroupSync::StartGradSyncAt(Chain& chain, int pos) {
  // A param sync still in flight is finished first, so the collective order does not depend on
  // how far the forward got.
  if (param_sync_in_flight()) RETURN_IF_ERROR(FinishParamSync());
  ParamAndGradBucketGroup& group = *chain.order[pos];
  // kSharded: at most kMaxShardedGradSyncsInFlight grad syncs in flight, so that full grads are
  // released as backward goes (their input must live until they finish).
  constexpr int kMax = kMaxShardedGradSyncsInFlight;
  if (group.buffer().residency() == Residency::kSharded) {
    if (pos >= kMax) RETURN_IF_ERROR(chain.order[pos - kMax]->FinishGradSync());
    bool materialized = true;  // StartGradSync materializes (zero-fills) the rest
    for (int bucket : group.buckets()) {
      materialized = materialized && group.buffer().grads_materialized(bucket);
    }
    if (!materialized) RETURN_IF_ERROR(LimitGradSyncsInFlight());
  }
  return group.StartGradSync(accumulate_grad_shards_);
}

absl::Status BucketGroupSync::LimitGradSyncsInFlight() {
  int in_flight = 0;
  for (const Chain& chain : chains_) {
    for (const ParamAndGradBucketGroup* group : chain.order) {
      in_flight += group->grad_sync_in_flight();
    }
  }
  for (Chain& chain : chains_) {
    for (ParamAndGradBucketGroup* group : chain.order) {
      if (in_flight <= options_.grad_syncs_in_flight) return absl::OkStatus();
      if (!group->grad_sync_in_flight()) continue;
      RETURN_IF_ERROR(group->FinishGradSync());
      --in_flight;
    }
  }
  return absl::OkStatus();
}

absl::Status BucketGroupSync::RegisterGradReady(int b, int g) {
  if (!groups_[b][g]->RegisterGradReady() || !options_.overlap_grad_reduce) {
    return absl::OkStatus();
  }
  Chain& chain = chains_[chain_position_[group_offset_[b] + g].first];
  for (int pos = 0; pos < static_cast<int>(chain.order.size()); ++pos) {
    ParamAndGradBucketGroup& group = *chain.order[pos];
    if (group.grad_state() != ParamAndGradBucketGroup::GradState::kNotStarted) continue;
    if (!group.grads_ready()) break;
    RETURN_IF_ERROR(StartGradSyncAt(chain, pos));
  }
  return absl::OkStatus();
}

absl::Status BucketGroupSync::FinishGradSync() {
  if (param_sync_in_flight()) RETURN_IF_ERROR(FinishParamSync());
  for (Chain& chain : chains_) {
    for (int pos = 0; pos < static_cast<int>(chain.order.size()); ++pos) {
      if (chain.order[pos]->grad_state() == ParamAndGradBucketGroup::GradState::kNotStarted) {
        RETURN_IF_ERROR(StartGradSyncAt(chain, pos));
      }
    }
  }
  for (Chain& chain : chains_) {
    for (ParamAndGradBucketGroup* group : chain.order) RETURN_IF_ERROR(group->FinishGradSync());
  }
  ResetGradSync();
  return absl::OkStatus();
}

void BucketGroupSync::ResetGradSync() {
  for (auto& buffer_groups : groups_) {
    for (auto& group : buffer_groups) group->ResetGradSync();
  }
}

// ---- Param sync.

bool BucketGroupSync::full_param_sync() const {
  return options_.grad_sync == GradSync::kReduceScatter && !buffers_.empty() &&
         buffers_[0]->residency() == Residency::kFull;
}

bool BucketGroupSync::param_sync_in_flight() const {
  if (!full_param_sync()) return false;
  for (const Chain& chain : chains_) {
    for (const ParamAndGradBucketGroup* group : chain.order) {
      if (group->param_state() != ParamAndGradBucketGroup::ParamState::kSynced) return true;
    }
  }
  return false;
}

int BucketGroupSync::num_param_sync_stages() const {
  if (!full_param_sync() || !options_.overlap_param_gather) return 0;
  int n = 0;
  for (const Chain& chain : chains_) n += static_cast<int>(chain.order.size());
  return n;
}

int BucketGroupSync::ParamSyncStage(int b, int bucket) const {
  if (num_param_sync_stages() == 0 || b < 0 || b >= num_buffers() || bucket < 0 ||
      bucket >= buffers_[b]->num_buckets()) {
    return -1;
  }
  const auto [c, pos] = chain_position_[group_offset_[b] + group_of_bucket_[b][bucket]];
  int stage = 0;
  for (int q = 0; q < c; ++q) stage += static_cast<int>(chains_[q].order.size());
  return stage + static_cast<int>(chains_[c].order.size()) - 1 - pos;  // the forward position
}

absl::Status BucketGroupSync::StartParamSyncsThrough(Chain& chain, int f) {
  for (int i = 0; i <= f; ++i) RETURN_IF_ERROR(AtForward(chain, i).StartParamSync());
  return absl::OkStatus();
}

absl::Status BucketGroupSync::BeginParamSync() {
  if (!full_param_sync()) return absl::OkStatus();
  if (param_sync_in_flight()) RETURN_IF_ERROR(FinishParamSync());
  for (Chain& chain : chains_) {
    for (ParamAndGradBucketGroup* group : chain.order) group->MarkParamsStale();
  }
  param_sync_begun_ = true;
  return absl::OkStatus();
}

absl::Status BucketGroupSync::ParamSyncStageDone(int stage) {
  const int num_stages = num_param_sync_stages();
  if (num_stages == 0) return absl::OkStatus();
  if (!param_sync_begun_ || stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param sync stage ", stage,
        !param_sync_begun_ ? " done before BeginParamSync"
                           : absl::StrCat(" out of range [0, ", num_stages, ")")));
  }
  for (Chain& chain : chains_) {
    const int n = static_cast<int>(chain.order.size());
    // Launch order is forward order on every rank: a stage launches the ones before it too.
    if (stage < n) return StartParamSyncsThrough(chain, stage);
    stage -= n;
  }
  return absl::OkStatus();
}

absl::Status BucketGroupSync::StartParamSync() {
  // Replicated optimizers updated every param on every rank: nothing to gather.
  if (options_.grad_sync == GradSync::kAllReduce) return absl::OkStatus();
  // Sharded: whatever is still gathered predates the step; the next forward gathers per layer.
  if (!full_param_sync()) return ReleaseAllParams();
  if (!param_sync_begun_) RETURN_IF_ERROR(BeginParamSync());
  param_sync_begun_ = false;
  if (!options_.overlap_param_gather) return FinishParamSync();
  for (Chain& chain : chains_) RETURN_IF_ERROR(AtForward(chain, 0).StartParamSync());
  return absl::OkStatus();
}

absl::Status BucketGroupSync::FinishParamSync() {
  if (options_.grad_sync == GradSync::kAllReduce) return absl::OkStatus();
  if (!full_param_sync()) {
    for (auto& buffer_groups : groups_) {
      for (auto& group : buffer_groups) {
        if (group->param_sync_in_flight()) RETURN_IF_ERROR(group->FinishParamSync());
      }
    }
    return absl::OkStatus();
  }
  for (Chain& chain : chains_) {
    const int n = static_cast<int>(chain.order.size());
    RETURN_IF_ERROR(StartParamSyncsThrough(chain, n - 1));
    for (int f = 0; f < n; ++f) RETURN_IF_ERROR(AtForward(chain, f).FinishParamSync());
  }
  return absl::OkStatus();
}

absl::Status BucketGroupSync::FinishParamSyncFor(int b, int g) {
  ParamAndGradBucketGroup& group = *groups_[b][g];
  if (!full_param_sync() || group.param_state() == ParamAndGradBucketGroup::ParamState::kSynced) {
    return absl::OkStatus();
  }
  const auto [c, pos] = chain_position_[group_offset_[b] + g];
  Chain& chain = chains_[c];
  const int n = static_cast<int>(chain.order.size());
  const int f = n - 1 - pos;
  RETURN_IF_ERROR(StartParamSyncsThrough(chain, f));
  for (int i = 0; i <= f; ++i) RETURN_IF_ERROR(AtForward(chain, i).FinishParamSync());
  // The next group in forward order (Megatron's next_param_gather_bucket_group).
  for (int i = f + 1; i < n; ++i) {
    ParamAndGradBucketGroup& next = AtForward(chain, i);
    if (next.param_state() == ParamAndGradBucketGroup::ParamState::kStale) {
      return next.StartParamSync();
    }
  }
  return absl::OkStatus();
}

absl::Status BucketGroupSync::ReleaseAllParams() {
  absl::Status first;
  for (auto& buffer_groups : groups_) {
    for (auto& group : buffer_groups) {
      absl::Status s = group->ReleaseParams();
      if (first.ok() && !s.ok()) first = std::move(s);
    }
  }
  return first;
}

}  // namespace orthoshard::buffers
