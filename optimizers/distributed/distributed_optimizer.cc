#include "optimizers/distributed/distributed_optimizer.h"

#include <algorithm>
#include <utility>

#include <ATen/ops/tensor.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "layout/layout.h"
#include "optimizers/distributed/tp_newton_schulz.h"
#include "optimizers/tp_muon.h"

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
        s.tp = p.tp;
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
        Slot s = Slot::Whole(p.name, param_part(p.start, p.end).view(shape),
                             grad_part(p.start, p.end).view(shape));
        s.tp = p.tp;
        slots.push_back(std::move(s));
      } else if (lo < hi) {
        Slot s;
        s.name = p.name;
        s.full_shape = buffer->Param(i).sizes().vec();
        s.offset = lo - p.start;
        s.param = param_part(lo, hi);
        s.grad = grad_part(lo, hi);
        s.saved_end = hi - lo;
        s.tp = p.tp;
        slots.push_back(std::move(s));
      }
    }
  }
  return slots;
}

absl::StatusOr<std::unique_ptr<ChainedOptimizer>> CreateDistributedOptimizer(
    std::vector<ParamAndGradBuffer*> buffers, collectives::Communicator* comm,
    ChainedConfig config, DistributedMode mode, const std::map<std::string, FusedSplit>& splits,
    buffers::BucketGroupSync* param_sync, collectives::Communicator* expert_comm,
    const TensorParallelOptimizer& tensor_parallel) {
  if (comm == nullptr) return absl::InvalidArgumentError("communicator is null");
  if (expert_comm == nullptr) expert_comm = comm;
  collectives::Communicator* tp = tensor_parallel.tp;
  const bool tp_active = tp != nullptr && tp->size() > 1;
  collectives::Communicator* stats = tensor_parallel.stats;
  if (stats != nullptr && stats->size() != comm->size() * (tp_active ? tp->size() : 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the statistics communicator has ", stats->size(), " ranks; expected the tp ",
        tp_active ? tp->size() : 1, " x dp ", comm->size(), " grid"));
  }
  if (tp_active && stats == nullptr && mode == DistributedMode::kSharded) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism over ", tp->size(), " ranks with a sharded optimizer needs a "
        "statistics communicator spanning the tp x dp grid (each rank holds other gradients)"));
  }
  // The ranks whose local statistics are summed: every param is counted once over them.
  collectives::Communicator* stats_group = stats != nullptr ? stats : comm;
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
    // The statistics are summed over `stats_group` only: expert shards on ranks outside it would
    // be left out, each rank seeing another norm (dense dp 1 with expert dp 2 counted half the
    // experts).
    if (expert && stats_group->size() % expert_comm->size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert buffers are sharded over ", expert_comm->size(),
          " ranks, which do not divide the ", stats_group->size(),
          " ranks the gradient statistics are summed over: expert shards held outside them would "
          "not be counted (expert dp must divide dense dp, or pass the tp x dp grid as stats)"));
    }
    for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
      const layout::ParamPlacement& p = buffer->layout().params[i];
      if (p.tp.split() && (!tp_active || p.tp.size != tp->size() || p.tp.rank != tp->rank())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "' is split over tp as ", p.tp.ToString(), ", but this rank is ",
            tp_active ? absl::StrCat("tp rank ", tp->rank(), " of ", tp->size())
                      : std::string("not tensor-parallel (no tp communicator)")));
      }
      // Every rank checks every Muon param's split (of the global matrix), so that all reject a
      // bad one, owner or not.
      auto split = splits.find(p.name);
      if (split == splits.end() || p.role != layout::ParamRole::kMuon) continue;
      const std::vector<int64_t> global = TpGlobalShape(buffer->Param(i).sizes().vec(), p.tp);
      RETURN_IF_ERROR(ValidateSplit(p.name, split->second, global[0]));
      if (p.tp.split() && tensor_parallel.mode == MuonTpMode::kBlockwise) {
        RETURN_IF_ERROR(TpLocalFusedSplit(split->second, p.tp, p.name).status());
      }
    }
  }
  ASSIGN_OR_RETURN(std::vector<Slot> slots,
                   RankSlots(buffers, comm->rank(), mode, expert_comm->rank()));
  std::unique_ptr<StepSync> step_sync;
  if (param_sync != nullptr) {
    ASSIGN_OR_RETURN(step_sync, MakeStepSync(param_sync, buffers, mode));
  }
  std::unique_ptr<TpNewtonSchulz> tp_ns;
  if (tp_active && tensor_parallel.mode != MuonTpMode::kBlockwise) {
    ASSIGN_OR_RETURN(tp_ns, CollectiveTpNewtonSchulz::Create(tp, tensor_parallel.mode));
  }
  // Params not split over tp are the same on every tp rank: tp rank 0 counts them for all.
  if (tp_active) config.stats_skip_tp_replicated = tp->rank() != 0;
  std::unique_ptr<StatsReducer> reducer;
  // Sharded: each rank's slots are its shards, so the sum over the grid counts every element once
  // (experts too: each ep rank holds other experts, each expt_dp rank other shards of them; split
  // params: each tp rank other slices).
  // Replicated: every dp rank holds every param of its tp rank. Summed over the whole grid (a
  // stats communicator, or experts split over ep), each rank counts the elements it saves; over
  // the tp group alone (tp without a stats communicator), each its whole slices.
  if (mode == DistributedMode::kSharded) {
    reducer = std::make_unique<AllReduceStatsReducer>(stats_group);
  } else if (split_experts || (tp_active && stats != nullptr)) {
    config.stats_over_saved_elements = true;
    reducer = std::make_unique<AllReduceStatsReducer>(stats_group);
  } else if (tp_active) {
    reducer = std::make_unique<AllReduceStatsReducer>(tp);
  }
  return ChainedOptimizer::Create(std::move(config), LayoutRouting(buffers), std::move(slots),
                                  splits, std::move(reducer), std::move(step_sync),
                                  std::move(tp_ns));
}

}  // namespace orthoshard::optimizers::distributed
