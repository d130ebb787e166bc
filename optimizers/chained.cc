#include "optimizers/chained.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::optimizers {
namespace {

constexpr char kStepName[] = "chained/step";
constexpr char kSkippedName[] = "chained/skipped_steps";

}  // namespace

StepResult DecideStep(const ChainedConfig& config, const GradStats& global, int64_t steps_taken) {
  StepResult result;
  result.stats = global;
  const bool include_muon = config.clip_mode == ClipMode::kAllBeforeMomentum;
  result.grad_norm =
      std::sqrt(global.adamw_sum_squares + (include_muon ? global.muon_sum_squares : 0.0));
  if (global.nonfinite || !std::isfinite(global.adamw_sum_squares + global.muon_sum_squares)) {
    result.skipped = true;
    result.lr_multiplier = 0.0;
    return result;
  }
  if (config.max_grad_norm > 0.0) {
    const double coefficient = config.max_grad_norm / (result.grad_norm + 1e-6);
    if (coefficient < 1.0) result.clip_scale = coefficient;
  }
  result.lr_multiplier = LrMultiplier(config.schedule, steps_taken);
  return result;
}

double MuonClipScale(const ChainedConfig& config, const StepResult& result) {
  return config.clip_mode == ClipMode::kAllBeforeMomentum ? result.clip_scale : 1.0;
}

absl::StatusOr<std::unique_ptr<ChainedOptimizer>> ChainedOptimizer::Create(
    ChainedConfig config, RoutingReport routing, std::vector<Slot> slots,
    const std::map<std::string, FusedSplit>& splits, std::unique_ptr<StatsReducer> reducer,
    std::unique_ptr<StepSync> sync, std::unique_ptr<TpNewtonSchulz> tp_ns) {
  RETURN_IF_ERROR(ValidateSchedule(config.schedule));
  absl::flat_hash_map<std::string, Route> routes;
  for (const RoutingReport::Entry& e : routing.entries) routes[e.name] = e.route;
  for (const auto& [name, split] : splits) {
    if (!routes.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused split given for unknown param '", name, "'"));
    }
  }
  std::vector<Muon::Entry> muon;
  std::vector<AdamW::Entry> adamw;
  for (Slot& slot : slots) {
    auto route = routes.find(slot.name);
    if (route == routes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot of param '", slot.name, "', which the routing does not list"));
    }
    const bool no_decay =
        std::any_of(config.no_weight_decay_patterns.begin(),
                    config.no_weight_decay_patterns.end(),
                    [&](const std::string& pattern) { return GlobMatch(pattern, slot.name); });
    if (route->second == Route::kMuon) {
      auto split = splits.find(slot.name);
      MuonHyper hp = config.muon;
      if (no_decay) hp.weight_decay = 0.0;
      muon.push_back({std::move(slot), hp, split == splits.end() ? FusedSplit{} : split->second});
    } else {
      AdamWHyper hp = config.adamw;
      if (slot.full_shape.size() != 2) hp.weight_decay = config.adamw_non_matrix_weight_decay;
      if (no_decay) hp.weight_decay = 0.0;
      adamw.push_back({std::move(slot), hp});
    }
  }
  std::unique_ptr<ChainedOptimizer> opt(new ChainedOptimizer());
  ASSIGN_OR_RETURN(opt->adamw_, AdamW::Create(std::move(adamw)));
  opt->tp_ns_ = std::move(tp_ns);
  ASSIGN_OR_RETURN(opt->muon_, Muon::Create(std::move(muon), opt->tp_ns_.get()));
  opt->config_ = std::move(config);
  opt->routing_ = std::move(routing);
  opt->reducer_ = std::move(reducer);
  opt->sync_ = std::move(sync);
  if (opt->sync_ != nullptr && opt->sync_->num_stages() > 0) {
    StepSync* raw = opt->sync_.get();
    opt->sync_stages_.num_stages = raw->num_stages();
    opt->sync_stages_.stage_of = [raw](const Slot& slot) { return raw->StageOf(slot); };
    opt->sync_stages_.on_done = [raw](int stage) { return raw->StageDone(stage); };
  }
  return opt;
}

absl::StatusOr<std::unique_ptr<ChainedOptimizer>> ChainedOptimizer::Create(
    std::vector<Param> params, ChainedConfig config) {
  std::vector<ParamDescriptor> descriptors;
  std::vector<Slot> slots;
  std::map<std::string, FusedSplit> splits;
  for (Param& p : params) {
    ParamDescriptor d{p.name, {}};
    if (p.param.defined()) d.shape = p.param.sizes().vec();
    descriptors.push_back(std::move(d));
    if (!p.split.block_rows.empty()) splits[p.name] = p.split;
    slots.push_back(Slot::Whole(std::move(p.name), std::move(p.param), std::move(p.grad)));
  }
  ASSIGN_OR_RETURN(RoutingReport routing, PlanRouting(config.routing, descriptors));
  return Create(std::move(config), std::move(routing), std::move(slots), splits, nullptr);
}

double ChainedOptimizer::ns_cost() const { return muon_->ns_cost(); }

absl::StatusOr<GradStats> ChainedOptimizer::LocalGradStats() const {
  GradStats stats;
  const StatsScope saved{config_.stats_over_saved_elements, config_.stats_skip_tp_replicated};
  ASSIGN_OR_RETURN(stats.adamw_sum_squares, adamw_->GradSumSquares(saved));
  ASSIGN_OR_RETURN(stats.muon_sum_squares, muon_->GradSumSquares(saved));
  stats.nonfinite = !std::isfinite(stats.adamw_sum_squares + stats.muon_sum_squares);
  if (config_.params_norm) {
    ASSIGN_OR_RETURN(const double adamw, adamw_->ParamSumSquares(saved));
    ASSIGN_OR_RETURN(const double muon, muon_->ParamSumSquares(saved));
    stats.param_sum_squares = adamw + muon;
  }
  if (config_.count_zero_grads) {
    ASSIGN_OR_RETURN(const int64_t adamw, adamw_->GradZeros(saved));
    ASSIGN_OR_RETURN(const int64_t muon, muon_->GradZeros(saved));
    stats.zero_grads = static_cast<double>(adamw + muon);
  }
  return stats;
}

namespace {

// The slots of `opt` per stage: result[s] lists, in slot order, those with stage_of == s.
absl::StatusOr<std::vector<std::vector<int64_t>>> SlotsPerStage(const SlotOptimizer& opt,
                                                                const StepStages& stages) {
  std::vector<std::vector<int64_t>> out(std::max(stages.num_stages, 0));
  for (int64_t i = 0; i < opt.num_slots(); ++i) {
    const int s = stages.stage_of ? stages.stage_of(opt.slot(i)) : -1;
    if (s < 0 || s >= stages.num_stages) {
      return absl::InvalidArgumentError(absl::StrCat("step stages: ", opt.kind(), " slot '",
                                                     opt.slot(i).name, "' has stage ", s,
                                                     ", expected [0, ", stages.num_stages, ")"));
    }
    out[s].push_back(i);
  }
  return out;
}

}  // namespace

absl::StatusOr<StepResult> ChainedOptimizer::StepWithStats(const GradStats& global,
                                                           const StepStages* stages) {
  if (sync_ == nullptr) return Update(global, stages);
  RETURN_IF_ERROR(sync_->BeginStep());
  if (stages == nullptr && sync_stages_.num_stages > 0) stages = &sync_stages_;
  ASSIGN_OR_RETURN(const StepResult result, Update(global, stages));
  RETURN_IF_ERROR(sync_->EndStep());
  return result;
}

absl::Status ChainedOptimizer::SetRowScales(absl::string_view name, const at::Tensor& row_scales) {
  const auto entry =
      std::find_if(routing_.entries.begin(), routing_.entries.end(),
                   [&](const RoutingReport::Entry& e) { return e.name == name; });
  if (entry == routing_.entries.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("row scales for param '", name, "', which the routing does not list"));
  }
  SlotOptimizer& owner = entry->route == Route::kMuon ? static_cast<SlotOptimizer&>(*muon_)
                                                      : static_cast<SlotOptimizer&>(*adamw_);
  return owner.SetRowScales(name, row_scales).status();
}

absl::StatusOr<StepResult> ChainedOptimizer::Update(const GradStats& global,
                                                    const StepStages* stages) {
  const StepResult result = DecideStep(config_, global, steps_);
  if (result.skipped) {
    ++skipped_;
    adamw_->ClearRowScales();
    muon_->ClearRowScales();
    return result;
  }
  const StepContext adamw{result.lr_multiplier, result.clip_scale};
  const StepContext muon{result.lr_multiplier, MuonClipScale(config_, result)};
  if (stages == nullptr) {
    RETURN_IF_ERROR(adamw_->Step(adamw));
    RETURN_IF_ERROR(muon_->Step(muon));
  } else {
    ASSIGN_OR_RETURN(const auto adamw_slots, SlotsPerStage(*adamw_, *stages));
    ASSIGN_OR_RETURN(const auto muon_slots, SlotsPerStage(*muon_, *stages));
    for (int s = 0; s < stages->num_stages; ++s) {
      RETURN_IF_ERROR(adamw_->Step(adamw, adamw_slots[s]));
      RETURN_IF_ERROR(muon_->Step(muon, muon_slots[s]));
      if (stages->on_done) RETURN_IF_ERROR(stages->on_done(s));
    }
  }
  adamw_->ClearRowScales();  // those of slots without a gradient, which were not stepped
  muon_->ClearRowScales();
  ++steps_;
  return result;
}

absl::StatusOr<StepResult> ChainedOptimizer::Step(const StepStages* stages) {
  ASSIGN_OR_RETURN(GradStats stats, LocalGradStats());
  if (reducer_ != nullptr) {
    ASSIGN_OR_RETURN(stats, reducer_->Reduce(stats));
  }
  return StepWithStats(stats, stages);
}

std::vector<StateRecord> ChainedOptimizer::ExportState() const {
  std::vector<StateRecord> out;
  adamw_->ExportState(out);
  muon_->ExportState(out);
  out.push_back(CounterRecord(kStepName, steps_));
  out.push_back(CounterRecord(kSkippedName, skipped_));
  return out;
}

absl::Status ChainedOptimizer::ImportState(absl::Span<const StateRecord> state) {
  absl::flat_hash_map<std::string, const SlotOptimizer*> owner;
  for (const RoutingReport::Entry& e : routing_.entries) {
    owner[e.name] = e.route == Route::kMuon ? static_cast<const SlotOptimizer*>(muon_.get())
                                            : adamw_.get();
  }
  for (const StateRecord& r : state) {
    if (r.name == kStepName || r.name == kSkippedName) continue;
    const size_t slash = r.name.rfind('/');
    auto it = slash == std::string::npos ? owner.end() : owner.find(r.name.substr(0, slash));
    bool known = false;
    if (it != owner.end()) {
      for (const std::string& field : it->second->FieldNames()) {
        known = known || r.name.compare(slash + 1, std::string::npos, field) == 0;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected state tensor '", r.name, "'"));
    }
  }
  ASSIGN_OR_RETURN(const int64_t steps, ReadStateCounter(state, kStepName));
  ASSIGN_OR_RETURN(const int64_t skipped, ReadStateCounter(state, kSkippedName));
  // Validate both halves before either copies, so a failure leaves everything untouched.
  RETURN_IF_ERROR(adamw_->ImportState(state, /*validate_only=*/true));
  RETURN_IF_ERROR(muon_->ImportState(state, /*validate_only=*/true));
  RETURN_IF_ERROR(adamw_->ImportState(state));
  RETURN_IF_ERROR(muon_->ImportState(state));
  steps_ = steps;
  skipped_ = skipped;
  return absl::OkStatus();
}

}  // namespace orthoshard::optimizers
