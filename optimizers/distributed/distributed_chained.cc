// DistributedChainedOptimizer (see distributed_optimizer.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include <ATen/ops/tensor.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "layout/layout.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/routing.h"
#include "optimizers/schedule.h"

namespace orthoshard::optimizers::distributed {
namespace {

constexpr char kStepName[] = "chained/step";
constexpr char kSkippedName[] = "chained/skipped_steps";

bool IsLayerwiseStrategy(layout::Strategy s) { return s != layout::Strategy::kDistOpt; }

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedChainedOptimizer>> DistributedChainedOptimizer::Create(
    std::vector<buffers::ParamAndGradBuffer*> buffers, collectives::Communicator* comm,
    ChainedConfig config, DistributedMode mode, const std::map<std::string, FusedSplit>& splits) {
  if (comm == nullptr) return absl::InvalidArgumentError("communicator is null");
  RETURN_IF_ERROR(ValidateSchedule(config.schedule));
  std::vector<ParamDescriptor> descriptors;
  std::vector<BufferParamRef> refs;
  for (buffers::ParamAndGradBuffer* buffer : buffers) {
    if (buffer == nullptr) return absl::InvalidArgumentError("buffer is null");
    if (buffer->layout().dp != comm->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer ", buffer->layout().key.ToString(), " is sharded over dp ",
                       buffer->layout().dp, ", the communicator has ", comm->size(), " ranks"));
    }
    for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
      descriptors.push_back({buffer->layout().params[i].name, buffer->Param(i).sizes().vec()});
      refs.push_back({buffer, i});
    }
  }
  ASSIGN_OR_RETURN(RoutingReport report, PlanRouting(config.routing, descriptors));
  for (const auto& [name, split] : splits) {
    bool known = false;
    for (const ParamDescriptor& d : descriptors) known = known || d.name == name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused split given for unknown param '", name, "'"));
    }
  }
  // The split of param i (empty, i.e. one matrix, when `splits` has none).
  auto split_of = [&splits, &descriptors](size_t i) {
    auto it = splits.find(descriptors[i].name);
    return it == splits.end() ? FusedSplit{} : it->second;
  };
  std::unique_ptr<DistributedChainedOptimizer> opt(new DistributedChainedOptimizer());
  opt->buffers_ = std::move(buffers);
  opt->comm_ = comm;
  opt->mode_ = mode;
  if (mode == DistributedMode::kReplicated) {
    std::vector<Param> params;
    for (size_t i = 0; i < refs.size(); ++i) {
      const BufferParamRef& ref = refs[i];
      params.push_back({ref.buffer->layout().params[ref.index].name, ref.buffer->Param(ref.index),
                        ref.buffer->GradView(ref.index), split_of(i)});
    }
    ASSIGN_OR_RETURN(opt->replicated_, ChainedOptimizer::Create(std::move(params), config));
  } else {
    std::vector<LayerWiseParam> muon_params;
    std::vector<DistOptParam> adam_params;
    for (size_t i = 0; i < refs.size(); ++i) {
      const BufferParamRef& ref = refs[i];
      if (report.entries[i].route == Route::kMuon) {
        const layout::PerBufferParamLayout& layout = ref.buffer->layout();
        if (!IsLayerwiseStrategy(layout.strategy) &&
            layout.OwnerOf(layout.params[ref.index]) < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "param '", descriptors[i].name,
              "' is routed to muon but straddles a shard boundary of a distopt buffer; Muon "
              "needs whole matrices (use a shard-aligned layout)"));
        }
        muon_params.push_back({ref, config.muon, split_of(i)});
      } else {
        AdamWHyper hp = config.adamw;
        if (descriptors[i].shape.size() != 2) hp.weight_decay = config.adamw_non_matrix_weight_decay;
        adam_params.push_back({ref, hp});
      }
    }
    ASSIGN_OR_RETURN(opt->layerwise_, LayerWiseDistributedOptimizer::Create(
                                          std::move(muon_params), comm->rank(), comm->size()));
    ASSIGN_OR_RETURN(opt->distopt_, DistributedOptimizer::Create(std::move(adam_params),
                                                                 comm->rank(), comm->size()));
  }
  opt->config_ = std::move(config);
  opt->report_ = std::move(report);
  return opt;
}

absl::StatusOr<StepResult> DistributedChainedOptimizer::Step() {
  if (mode_ == DistributedMode::kReplicated) return replicated_->Step();
  ASSIGN_OR_RETURN(const double adamw_local, distopt_->LocalGradSumSquares());
  ASSIGN_OR_RETURN(const double muon_local, layerwise_->LocalGradSumSquares());
  const bool local_nonfinite = !std::isfinite(adamw_local + muon_local);
  // One all-reduce for every global statistic. A non-finite partial sum is sent as 0 with the flag
  // set, so the flag alone decides (inf - inf cannot turn into a finite sum).
  at::Tensor stats = at::tensor({local_nonfinite ? 0.0 : adamw_local,
                                 local_nonfinite ? 0.0 : muon_local, local_nonfinite ? 1.0 : 0.0},
                                at::kDouble)
                         .to(comm_->device());
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, comm_->AllReduce(stats));
  RETURN_IF_ERROR(work->Wait(comm_->timeout()));
  stats = stats.cpu();
  const double* reduced = stats.data_ptr<double>();
  const StepResult result = DecideStep(config_, GradStats{reduced[0], reduced[1]},
                                       /*any_nonfinite=*/reduced[2] > 0.0, steps_);
  if (result.skipped) {
    ++skipped_;
    return result;
  }
  RETURN_IF_ERROR(distopt_->Step({result.lr_multiplier, result.clip_scale}));
  RETURN_IF_ERROR(layerwise_->Step({result.lr_multiplier, MuonClipScale(config_, result)}));
  ++steps_;
  return result;
}

absl::Status DistributedChainedOptimizer::LaunchParamSync() {
  if (mode_ == DistributedMode::kReplicated) return absl::OkStatus();
  if (!pending_sync_.empty()) {
    return absl::FailedPreconditionError("param sync launched twice without WaitParamSync");
  }
  ASSIGN_OR_RETURN(pending_sync_, buffers::LaunchParamSync(*comm_, buffers_));
  return absl::OkStatus();
}

absl::Status DistributedChainedOptimizer::WaitParamSync() {
  return buffers::WaitAll(pending_sync_, comm_->timeout());
}

absl::StatusOr<StepResult> DistributedChainedOptimizer::StepAndSync() {
  ASSIGN_OR_RETURN(StepResult result, Step());
  RETURN_IF_ERROR(LaunchParamSync());
  RETURN_IF_ERROR(WaitParamSync());
  return result;
}

int64_t DistributedChainedOptimizer::steps_taken() const {
  return replicated_ ? replicated_->steps_taken() : steps_;
}

int64_t DistributedChainedOptimizer::skipped_steps() const {
  return replicated_ ? replicated_->skipped_steps() : skipped_;
}

std::vector<std::string> DistributedChainedOptimizer::OwnedMuonParams() const {
  if (layerwise_) return layerwise_->OwnedParams();
  std::vector<std::string> names;
  for (const RoutingReport::Entry& e : report_.entries) {
    if (e.route == Route::kMuon) names.push_back(e.name);
  }
  return names;
}

std::vector<ShardedTensor> DistributedChainedOptimizer::ExportState() const {
  std::vector<ShardedTensor> out;
  if (replicated_) {
    // Every rank holds the whole state; each exports only the elements its shards of the buffers
    // cover (a param's scalars: the rank holding its first element), so that the ranks' exports
    // together describe the state once, as in kSharded, and a checkpoint is not dp times larger.
    const int rank = comm_->rank();
    for (const NamedTensor& t : replicated_->ExportState()) {
      std::string name = t.name;
      if (absl::StartsWith(name, "adamw/")) name = name.substr(6);
      if (absl::StartsWith(name, "muon/")) name = name.substr(5);
      if (absl::StartsWith(name, "chained/")) {
        out.push_back({name, {}, 0, t.tensor.clone()});
        continue;
      }
      const std::string param = name.substr(0, name.rfind('/'));
      for (const buffers::ParamAndGradBuffer* buffer : buffers_) {
        const layout::PerBufferParamLayout& lay = buffer->layout();
        for (const layout::ParamPlacement& p : lay.params) {
          if (p.name != param) continue;
          if (t.tensor.dim() == 0) {
            const auto [s, e] = lay.ShardRange(p.bucket, rank);
            if (p.start >= s && p.start < e) out.push_back({name, {}, 0, t.tensor.clone()});
            continue;
          }
          const at::Tensor flat = t.tensor.reshape({-1});
          for (size_t b = 0; b < lay.buckets.size(); ++b) {
            const auto [s, e] = lay.ShardRange(static_cast<int>(b), rank);
            const int64_t lo = std::max(s, p.start), hi = std::min(e, p.end);
            if (lo >= hi) continue;
            out.push_back({name, t.tensor.sizes().vec(), lo - p.start,
                           flat.narrow(0, lo - p.start, hi - lo).clone()});
          }
        }
      }
    }
    return out;
  }
  out = distopt_->ExportState();
  for (ShardedTensor& t : layerwise_->ExportState()) out.push_back(std::move(t));
  out.push_back({kStepName, {}, 0, at::tensor({steps_}, at::kLong).reshape({})});
  out.push_back({kSkippedName, {}, 0, at::tensor({skipped_}, at::kLong).reshape({})});
  return out;
}

absl::Status DistributedChainedOptimizer::ImportState(absl::Span<const ShardedTensor> state) {
  if (replicated_) {
    ASSIGN_OR_RETURN(std::vector<NamedTensor> whole, AssembleModelSpace(state));
    std::vector<NamedTensor> prefixed;
    for (NamedTensor& t : whole) {
      if (absl::StartsWith(t.name, "chained/")) {
        prefixed.push_back(std::move(t));
        continue;
      }
      const std::string param = t.name.substr(0, t.name.rfind('/'));
      const char* prefix = nullptr;
      for (const RoutingReport::Entry& e : report_.entries) {
        if (e.name == param) prefix = e.route == Route::kMuon ? "muon/" : "adamw/";
      }
      if (prefix == nullptr) continue;  // not state of a param of ours (as in kSharded)
      prefixed.push_back({absl::StrCat(prefix, t.name), t.tensor});
    }
    return replicated_->ImportState(prefixed);
  }
  int64_t steps = -1, skipped = -1;
  for (const ShardedTensor& t : state) {
    if (t.name == kStepName) steps = t.tensor.item<int64_t>();
    if (t.name == kSkippedName) skipped = t.tensor.item<int64_t>();
  }
  if (steps < 0) return absl::NotFoundError(absl::StrCat("missing state tensor '", kStepName, "'"));
  if (skipped < 0) {
    return absl::NotFoundError(absl::StrCat("missing state tensor '", kSkippedName, "'"));
  }
  // Validate both halves before either copies, so a failure leaves everything untouched.
  RETURN_IF_ERROR(layerwise_->ImportState(state, /*validate_only=*/true));
  RETURN_IF_ERROR(distopt_->ImportState(state, /*validate_only=*/true));
  RETURN_IF_ERROR(layerwise_->ImportState(state));
  RETURN_IF_ERROR(distopt_->ImportState(state));
  steps_ = steps;
  skipped_ = skipped;
  return absl::OkStatus();
}

}  // namespace orthoshard::optimizers::distributed
