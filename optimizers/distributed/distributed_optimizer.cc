#include "optimizers/distributed/distributed_optimizer.h"

#include <algorithm>
#include <utility>

#include <ATen/ops/tensor.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "layout/layout.h"

namespace orthoshard::optimizers::distributed {

using buffers::ParamAndGradBuffer;

absl::StatusOr<GradStats> AllReduceStatsReducer::Reduce(const GradStats& local) {
  const bool nonfinite = local.nonfinite;
  at::Tensor stats = at::tensor({nonfinite ? 0.0 : local.adamw_sum_squares,
                                 nonfinite ? 0.0 : local.muon_sum_squares, nonfinite ? 1.0 : 0.0,
                                 local.param_sum_squares, local.zero_grads},
                                at::kDouble)
                         .to(comm_->device());
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, comm_->AllReduce(stats));
  RETURN_IF_ERROR(work->Wait(comm_->timeout()));
  stats = stats.cpu();
  const double* reduced = stats.data_ptr<double>();
  return GradStats{reduced[0], reduced[1], reduced[2] > 0.0, reduced[3], reduced[4]};
}

namespace {

// The param sync of the buffers' bucket groups, run by the optimizer's step: one stage per bucket
// group in param gather order (BucketGroupSync::ParamSyncStage), looked up by slot name.
class BucketGroupStepSync final : public StepSync {
 public:
  BucketGroupStepSync(buffers::BucketGroupSync* sync, absl::flat_hash_map<std::string, int> stages)
      : sync_(sync), stages_(std::move(stages)) {}

  int num_stages() const override { return sync_->num_param_sync_stages(); }
  int StageOf(const Slot& slot) const override {
    const auto it = stages_.find(slot.name);
    return it == stages_.end() ? -1 : it->second;
  }
  absl::Status BeginStep() override { return sync_->BeginParamSync(); }
  absl::Status StageDone(int stage) override { return sync_->ParamSyncStageDone(stage); }
  absl::Status EndStep() override { return sync_->StartParamSync(); }

 private:
  buffers::BucketGroupSync* sync_;
  absl::flat_hash_map<std::string, int> stages_;  // param name -> stage
};

absl::StatusOr<std::unique_ptr<StepSync>> MakeStepSync(
    buffers::BucketGroupSync* sync, absl::Span<ParamAndGradBuffer* const> buffers,
    DistributedMode mode) {
  const buffers::GradSync expected = mode == DistributedMode::kSharded
                                         ? buffers::GradSync::kReduceScatter
                                         : buffers::GradSync::kAllReduce;
  if (sync->options().grad_sync != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the param sync's bucket groups use the ",
        sync->options().grad_sync == buffers::GradSync::kReduceScatter ? "reduce-scatter"
                                                                       : "all-reduce",
        " grad sync; a ", mode == DistributedMode::kSharded ? "sharded" : "replicated",
        " optimizer needs the ",
        expected == buffers::GradSync::kReduceScatter ? "reduce-scatter" : "all-reduce"));
  }
  absl::flat_hash_map<std::string, int> stages;
  for (const ParamAndGradBuffer* buffer : buffers) {
    const int b = sync->BufferIndex(buffer);
    if (b < 0) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", buffer->layout().key.ToString(),
                                                     " is not one of the param sync's buffers"));
    }
    for (const layout::ParamPlacement& p : buffer->layout().params) {
      stages[p.name] = sync->ParamSyncStage(b, p.bucket);
    }
  }
  return std::make_unique<BucketGroupStepSync>(sync, std::move(stages));
}

}  // namespace

RoutingReport LayoutRouting(absl::Span<ParamAndGradBuffer* const> buffers) {
  RoutingReport report;
  for (const ParamAndGradBuffer* buffer : buffers) {
    if (buffer == nullptr) continue;
    for (const layout::ParamPlacement& p : buffer->layout().params) {
      const bool muon = p.role == layout::ParamRole::kMuon;
      report.entries.push_back({p.name, muon ? Route::kMuon : Route::kAdamW,
                                "role in the layout", p.numel()});
      (muon ? report.muon_count : report.adamw_count) += 1;
      (muon ? report.muon_numel : report.adamw_numel) += p.numel();
    }
  }
  return report;
}

absl::StatusOr<std::vector<Slot>> RankSlots(absl::Span<ParamAndGradBuffer* const> buffers,
                                            int dense_rank, DistributedMode mode,
                                            int expert_rank) {
  std::vector<Slot> slots;
  for (ParamAndGradBuffer* buffer : buffers) {
    if (buffer == nullptr) return absl::InvalidArgumentError("buffer is null");
    const layout::PerBufferParamLayout& layout = buffer->layout();
    const int rank = layout.key.expert && expert_rank >= 0 ? expert_rank : dense_rank;
    if (mode == DistributedMode::kReplicated && buffer->residency() != buffers::Residency::kFull) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer ", layout.key.ToString(), " keeps only rank ", buffer->rank(),
          "'s shards (sharded residency); replicated optimizers step every param whole"));
    }
    for (int i = 0; i < static_cast<int>(layout.params.size()); ++i) {
      const layout::ParamPlacement& p = layout.params[i];
      const auto [shard_begin, shard_end] = layout.ShardRange(p.bucket, rank);
      const int64_t lo = std::max(p.start, shard_begin);
      const int64_t hi = std::min(p.end, shard_end);
      if (mode == DistributedMode::kReplicated) {
        Slot s = Slot::Whole(p.name, buffer->ParamView(i), buffer->GradView(i));
        s.saved_begin = lo < hi ? lo - p.start : 0;
        s.saved_end = lo < hi ? hi - p.start : 0;
        slots.push_back(std::move(s));
        continue;
      }
      // Sharded: views of this rank's shards, which hold the reduced gradients and which the param
      // sync gathers from, in either residency.
      auto param_part = [&](int64_t begin, int64_t end) {
        return buffer->ParamShard(p.bucket, rank).narrow(0, begin - shard_begin, end - begin);
      };
      auto grad_part = [&](int64_t begin, int64_t end) {
        return buffer->GradShard(p.bucket, rank).narrow(0, begin - shard_begin, end - begin);
      };
      if (p.role == layout::ParamRole::kMuon) {
        const int owner = layout.OwnerOf(p);
        if (owner < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "param '", p.name, "' is routed to muon but straddles a shard boundary of a ",
              layout::StrategyName(layout.strategy),
              " buffer; Muon needs whole matrices (use a shard-aligned layout)"));
        }
        if (owner != rank) continue;
        const c10::IntArrayRef shape = buffer->Param(i).sizes();
        slots.push_back(Slot::Whole(p.name, param_part(p.start, p.end).view(shape),
                                    grad_part(p.start, p.end).view(shape)));
      } else if (lo < hi) {
        Slot s;
        s.name = p.name;
        s.full_shape = buffer->Param(i).sizes().vec();
        s.offset = lo - p.start;
        s.param = param_part(lo, hi);
        s.grad = grad_part(lo, hi);
        s.saved_end = hi - lo;
        slots.push_back(std::move(s));
      }
    }
  }
  return slots;
}

absl::StatusOr<std::unique_ptr<ChainedOptimizer>> CreateDistributedOptimizer(
    std::vector<ParamAndGradBuffer*> buffers, collectives::Communicator* comm,
    ChainedConfig config, DistributedMode mode, const std::map<std::string, FusedSplit>& splits,
    buffers::BucketGroupSync* param_sync, collectives::Communicator* expert_comm) {
  if (comm == nullptr) return absl::InvalidArgumentError("communicator is null");
  if (expert_comm == nullptr) expert_comm = comm;
  bool split_experts = false;  // expert buffers over a smaller group than the dense ones
  for (const ParamAndGradBuffer* buffer : buffers) {
    if (buffer == nullptr) return absl::InvalidArgumentError("buffer is null");
    const bool expert = buffer->layout().key.expert;
    const collectives::Communicator* group = expert ? expert_comm : comm;
    if (buffer->layout().dp != group->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer ", buffer->layout().key.ToString(), " is sharded over dp ", buffer->layout().dp,
          ", the ", expert ? "expert " : "", "communicator has ", group->size(), " ranks"));
    }
    split_experts = split_experts || (expert && expert_comm->size() != comm->size());
    // The statistics are summed over `comm` only: expert shards on ranks outside it would be left
    // out, each rank seeing another norm (dense dp 1 with expert dp 2 counted half the experts).
    if (expert && comm->size() % expert_comm->size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert buffers are sharded over ", expert_comm->size(),
          " ranks, which do not divide the ", comm->size(),
          " ranks of the dense data-parallel group the gradient statistics are summed over: "
          "expert shards held outside it would not be counted (expert dp must divide dense dp)"));
    }
    // Every rank checks every Muon param's split, so that all reject a bad one, owner or not.
    for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
      const layout::ParamPlacement& p = buffer->layout().params[i];
      auto split = splits.find(p.name);
      if (split == splits.end() || p.role != layout::ParamRole::kMuon) continue;
      RETURN_IF_ERROR(ValidateSplit(p.name, split->second, buffer->Param(i).size(0)));
    }
  }
  ASSIGN_OR_RETURN(std::vector<Slot> slots,
                   RankSlots(buffers, comm->rank(), mode, expert_comm->rank()));
  std::unique_ptr<StepSync> step_sync;
  if (param_sync != nullptr) {
    ASSIGN_OR_RETURN(step_sync, MakeStepSync(param_sync, buffers, mode));
  }
  std::unique_ptr<StatsReducer> reducer;
  // Sharded: each rank's slots are its shards, so the sum over `comm` counts every element once
  // (experts too: each ep rank holds other experts, each expt_dp rank other shards of them).
  // Replicated with experts split over ep: every rank counts the elements it saves, summed the
  // same way.
  if (mode == DistributedMode::kReplicated && split_experts) {
    config.stats_over_saved_elements = true;
  }
  if (mode == DistributedMode::kSharded || split_experts) {
    reducer = std::make_unique<AllReduceStatsReducer>(comm);
  }
  return ChainedOptimizer::Create(std::move(config), LayoutRouting(buffers), std::move(slots),
                                  splits, std::move(reducer), std::move(step_sync));
}

}  // namespace orthoshard::optimizers::distributed
