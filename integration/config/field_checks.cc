// The checks of single fields (field_checks.h) and DoubleRange (trainer_config.h).
#include "integration/config/field_checks.h"

#include <cfloat>
#include <cmath>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace orthoshard::integration {
namespace internal_config {
namespace {

// The most an MoE loss weight may be. The weighted term's gradient is the weight times the
// unweighted loss's; the clip's global norm takes an fp32 norm of every gradient, whose sum of
// squares leaves fp32's range once entries pass 2^64 (and then every step is skipped as
// non-finite). A weight of at most 2^32 leaves the unweighted losses' gradient entries 2^32 of
// room. Measured on moe-tiny (3 steps): a z-loss weight of 1e19 skipped every step, 1e15 none;
// Switch Transformer's 0.01 and ST-MoE's 0.001 are 2^38 and more below the bound.
constexpr double kMaxMoeLossWeight = 0x1p32;

// Every double field's accepted values (DoubleRange), with the reason for each bound.
struct NamedRange {
  const char* field;
  DoubleRange range;
};
const NamedRange kDoubleRanges[] = {
    {"moe_aux_loss_coeff",
     {0, kMaxMoeLossWeight, false, false, -1.0,
      "a loss weight, -1 = 0.01; 2^32 keeps its gradients' squares inside fp32"}},
    {"moe_z_loss_coeff",
     {0, kMaxMoeLossWeight, false, false, -1.0,
      "a loss weight, -1 = 0.001; 2^32 keeps its gradients' squares inside fp32"}},
    {"lr",
     {0, kMaxKernelScalar, true, false, std::nullopt,
      "a step size, an fp32 kernel's scalar: 2^64 x 2^64 is still below FLT_MAX"}},
    {"muon_lr",
     {0, kMaxKernelScalar / kMaxMuonShapeScale, true, false, std::nullopt,
      "a step size: times the largest shape scale, 2^25, it stays within an fp32 kernel's 2^64"}},
    {"weight_decay",
     {0, kMaxKernelScalar, false, false, std::nullopt,
      "an fp32 kernel's scalar; --lr x it must also be <= 2"}},
    {"muon_weight_decay",
     {0, kMaxKernelScalar, false, false, std::nullopt,
      "an fp32 kernel's scalar; --muon_lr x it must also be <= 2"}},
    {"muon_momentum",
     {0, 1, false, true, std::nullopt, "a decay: at 1 or more the buffer never forgets and grows"}},
    {"muon_extra_scale",
     {0, kMaxKernelScalar, true, false, std::nullopt,
      "a factor of the lr, an fp32 kernel's scalar; --muon_lr x it must also be <= 2^39"}},
    {"adam_beta1",
     {0, 1, false, true, std::nullopt, "a decay: at 1 the bias correction divides by 0"}},
    {"adam_beta2",
     {0, 1, false, true, std::nullopt, "a decay: at 1 the bias correction divides by 0"}},
    {"adam_eps", {0, kMaxKernelScalar, false, false, std::nullopt, "added to sqrt(v) in fp32"}},
    {"max_grad_norm",
     {-DBL_MAX, DBL_MAX, false, false, std::nullopt,
      "compared with the global norm in double, <= 0 disables; NaN would silently never clip"}},
    {"qk_clip_threshold",
     {0, FLT_MAX, false, false, std::nullopt,
      "compared with fp32 attention logits, which never exceed FLT_MAX; 0 = off"}},
    {"min_lr_ratio", {0, 1, false, false, std::nullopt, "a fraction of the lr"}},
    {"eval_fraction",
     {0, 1, true, true, std::nullopt, "a fraction of the data: neither part may be empty"}},
    {"bucket_padding", {0, 1, false, false, std::nullopt, "a fraction of a bucket"}},
    {"max_bucket_padding", {0, 1, false, false, std::nullopt, "a fraction of a bucket"}},
};

// `value` as a bound is read: 2^N for a power of two from 2^10 up, else %g.
std::string BoundText(double value) {
  int exponent = 0;
  if (value > 0 && std::frexp(value, &exponent) == 0.5 && exponent - 1 >= 10) {
    return absl::StrCat("2^", exponent - 1);
  }
  return absl::StrCat(value);
}

// `value` of double field `field` is within its DoubleRange. Errors: kInvalidArgument naming the
// flag, the value and the range; kInternal for a field that has no range.
absl::Status CheckDoubleRange(const char* field, double value) {
  const DoubleRange* range = DoubleRangeOf(field);
  if (range == nullptr) {
    return absl::InternalError(absl::StrCat("--", field,
                                            " has no declared range (field_checks.cc's "
                                            "kDoubleRanges lists every double field)"));
  }
  if (range->Contains(value)) return absl::OkStatus();
  const bool finite = range->min == -DBL_MAX && range->max == DBL_MAX;
  return absl::InvalidArgumentError(
      absl::StrCat("--", field, finite ? " must be finite" : " must be in ",
                   finite ? "" : range->ToString(), ", got ", value, " (", range->why, ")"));
}

template <typename T>
absl::Status CheckRangeOf(const char* field, const T& value) {
  if constexpr (std::is_same_v<T, double>) return CheckDoubleRange(field, value);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDoubleRanges(const TrainerConfig& c) {
  absl::Status status;
#define ORTHOSHARD_CHECK_RANGE(type, name, default_value, help) \
  if (status.ok()) status = CheckRangeOf(#name, c.name);
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_CHECK_RANGE)
#undef ORTHOSHARD_CHECK_RANGE
  return status;
}

namespace {

// A flag that does something only in some modes: what it needs, and whether `c` has it.
struct ModeOnlyFlag {
  const char* field;
  const char* needs;
  bool (*applies)(const TrainerConfig& c);
};
const ModeOnlyFlag kModeOnlyFlags[] = {
    {"muon_tp_mode", "--tp > 1 and --optimizer=muon (it says how Muon orthogonalises tp-split "
                     "matrices)",
     [](const TrainerConfig& c) { return c.tp > 1 && c.optimizer == OptimizerChoice::kMuon; }},
    {"fsdp_grad_syncs_in_flight", "--dist=fsdp",
     [](const TrainerConfig& c) { return c.dist == DistMode::kFsdp; }},
    {"fsdp_grad_accum", "--dist=fsdp",
     [](const TrainerConfig& c) { return c.dist == DistMode::kFsdp; }},
    {"reshard_after_forward", "--dist=fsdp",
     [](const TrainerConfig& c) { return c.dist == DistMode::kFsdp; }},
    {"prefetch_params", "--dist=fsdp",
     [](const TrainerConfig& c) { return c.dist == DistMode::kFsdp; }},
    {"overlap_param_gather", "--dist=layerwise, distopt or fsdp (replicated gathers no params)",
     [](const TrainerConfig& c) { return SpecOf(c.dist).sharded_step; }},
    {"recompute_layers", "--recompute=full or --recompute=selective",
     [](const TrainerConfig& c) { return c.recompute != RecomputeMode::kNone; }},
    {"muon_extra_scale", "--muon_scale_rule=spectral (the only rule that reads it)",
     [](const TrainerConfig& c) {
       return c.muon_scale_rule == optimizers::MuonScaleRule::kSpectral;
     }},
    {"route", "--optimizer=muon (with adamw every param goes to AdamW)",
     [](const TrainerConfig& c) { return c.optimizer == OptimizerChoice::kMuon; }},
    {"decay_steps", "--schedule=wsd (the only schedule with a final decay phase)",
     [](const TrainerConfig& c) { return c.schedule == optimizers::ScheduleKind::kWsd; }},
    {"grad_reduce_in_fp32", "--precision=bf16 (fp32 gradients are reduced in fp32 anyway)",
     [](const TrainerConfig& c) { return c.precision == Precision::kBf16; }},
};

}  // namespace

absl::Status ValidateGivenFlags(const TrainerConfig& c) {
  for (const ModeOnlyFlag& flag : kModeOnlyFlags) {
    if (c.given.count(flag.field) == 0 || flag.applies(c)) continue;
    return absl::InvalidArgumentError(absl::StrCat("--", flag.field, " needs ", flag.needs,
                                                   "; it does nothing here: drop it"));
  }
  return absl::OkStatus();
}

}  // namespace internal_config

bool DoubleRange::Contains(double value) const {
  if (sentinel.has_value() && value == *sentinel) return true;
  return (min_open ? value > min : value >= min) && (max_open ? value < max : value <= max);
}

std::string DoubleRange::ToString() const {
  const std::string interval =
      min == -DBL_MAX && max == DBL_MAX
          ? std::string("finite")
          : absl::StrCat(min_open ? "(" : "[", internal_config::BoundText(min), ", ",
                         internal_config::BoundText(max), max_open ? ")" : "]");
  return sentinel.has_value() ? absl::StrCat(interval, " or ", *sentinel) : interval;
}

const DoubleRange* DoubleRangeOf(absl::string_view field) {
  for (const internal_config::NamedRange& named : internal_config::kDoubleRanges) {
    if (field == named.field) return &named.range;
  }
  return nullptr;
}

}  // namespace orthoshard::integration
