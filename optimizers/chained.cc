#include "optimizers/chained.h"

#include <cmath>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::optimizers {
namespace {

constexpr char kAdamWPrefix[] = "adamw/";
constexpr char kMuonPrefix[] = "muon/";
constexpr char kStepName[] = "chained/step";
constexpr char kSkippedName[] = "chained/skipped_steps";

void AppendPrefixed(const std::vector<NamedTensor>& in, const char* prefix,
                    std::vector<NamedTensor>& out) {
  for (const NamedTensor& t : in) out.push_back({absl::StrCat(prefix, t.name), t.tensor});
}

std::vector<NamedTensor> StripPrefix(absl::Span<const NamedTensor> in, absl::string_view prefix) {
  std::vector<NamedTensor> out;
  for (const NamedTensor& t : in) {
    if (absl::StartsWith(t.name, prefix)) {
      out.push_back({std::string(t.name.substr(prefix.size())), t.tensor});
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChainedOptimizer>> ChainedOptimizer::Create(
    std::vector<Param> params, ChainedConfig config) {
  RETURN_IF_ERROR(ValidateSchedule(config.schedule));
  std::vector<ParamDescriptor> descriptors;
  for (const Param& p : params) {
    ParamDescriptor d{p.name, {}};
    if (p.param.defined()) d.shape = p.param.sizes().vec();
    descriptors.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(RoutingReport report, PlanRouting(config.routing, descriptors));
  AdamWGroup adamw_group{config.adamw, {}};
  AdamWGroup adamw_non_matrix_group{config.adamw, {}};
  adamw_non_matrix_group.hp.weight_decay = config.adamw_non_matrix_weight_decay;
  MuonGroup muon_group{config.muon, {}};
  for (size_t i = 0; i < params.size(); ++i) {
    if (report.entries[i].route == Route::kMuon) {
      muon_group.params.push_back(std::move(params[i]));
    } else if (descriptors[i].shape.size() == 2) {
      adamw_group.params.push_back(std::move(params[i]));
    } else {
      adamw_non_matrix_group.params.push_back(std::move(params[i]));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<AdamW> adamw,
                   AdamW::Create({std::move(adamw_group), std::move(adamw_non_matrix_group)}));
  ASSIGN_OR_RETURN(std::unique_ptr<Muon> muon, Muon::Create({std::move(muon_group)}));
  return std::unique_ptr<ChainedOptimizer>(new ChainedOptimizer(
      std::move(config), std::move(report), std::move(adamw), std::move(muon)));
}

absl::StatusOr<GradStats> ChainedOptimizer::LocalGradStats() const {
  GradStats stats;
  ASSIGN_OR_RETURN(stats.adamw_sum_squares, adamw_->GradSumSquares());
  ASSIGN_OR_RETURN(stats.muon_sum_squares, muon_->GradSumSquares());
  return stats;
}

StepResult DecideStep(const ChainedConfig& config, const GradStats& global, bool any_nonfinite,
                      int64_t steps_taken) {
  StepResult result;
  result.stats = global;
  const bool include_muon = config.clip_mode == ClipMode::kAllBeforeMomentum;
  result.grad_norm =
      std::sqrt(global.adamw_sum_squares + (include_muon ? global.muon_sum_squares : 0.0));
  if (any_nonfinite || !std::isfinite(global.adamw_sum_squares + global.muon_sum_squares)) {
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

absl::StatusOr<StepResult> ChainedOptimizer::StepWithStats(const GradStats& stats) {
  const StepResult result = DecideStep(config_, stats, /*any_nonfinite=*/false, steps_);
  if (result.skipped) {
    ++skipped_;
    return result;
  }
  RETURN_IF_ERROR(adamw_->Step({result.lr_multiplier, result.clip_scale}));
  RETURN_IF_ERROR(muon_->Step({result.lr_multiplier, MuonClipScale(config_, result)}));
  ++steps_;
  return result;
}

absl::StatusOr<StepResult> ChainedOptimizer::Step() {
  ASSIGN_OR_RETURN(GradStats stats, LocalGradStats());
  return StepWithStats(stats);
}

std::vector<NamedTensor> ChainedOptimizer::ExportState() const {
  std::vector<NamedTensor> out;
  AppendPrefixed(adamw_->ExportState(), kAdamWPrefix, out);
  AppendPrefixed(muon_->ExportState(), kMuonPrefix, out);
  out.push_back({kStepName, at::full({}, steps_, at::kLong)});
  out.push_back({kSkippedName, at::full({}, skipped_, at::kLong)});
  return out;
}

absl::Status ChainedOptimizer::ImportState(absl::Span<const NamedTensor> state) {
  for (const NamedTensor& t : state) {
    if (t.name != kStepName && t.name != kSkippedName && !absl::StartsWith(t.name, kAdamWPrefix) &&
        !absl::StartsWith(t.name, kMuonPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected state tensor '", t.name, "'"));
    }
  }
  const at::Tensor like = at::empty({}, at::kLong);
  ASSIGN_OR_RETURN(at::Tensor step, FindState(state, kStepName, like));
  ASSIGN_OR_RETURN(at::Tensor skipped, FindState(state, kSkippedName, like));
  // Validate the Muon half before the AdamW import writes anything (each import validates its own
  // half fully before copying).
  const std::vector<NamedTensor> muon_state = StripPrefix(state, kMuonPrefix);
  std::vector<std::string> muon_names;
  for (const NamedTensor& expected : muon_->ExportState()) {
    RETURN_IF_ERROR(FindState(muon_state, expected.name, expected.tensor).status());
    muon_names.push_back(expected.name);
  }
  RETURN_IF_ERROR(CheckNoUnexpectedState(muon_state, muon_names));
  RETURN_IF_ERROR(adamw_->ImportState(StripPrefix(state, kAdamWPrefix)));
  RETURN_IF_ERROR(muon_->ImportState(muon_state));
  steps_ = step.item<int64_t>();
  skipped_ = skipped.item<int64_t>();
  return absl::OkStatus();
}

absl::Status ChainedOptimizer::SetGrad(const std::string& name, const at::Tensor& grad) {
  absl::Status s = adamw_->SetGrad(name, grad);
  if (!absl::IsNotFound(s)) return s;
  return muon_->SetGrad(name, grad);
}

}  // namespace orthoshard::optimizers
