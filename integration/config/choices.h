// The fixed-choice fields of TrainerConfig as closed types: each field's enum and one table of its
// accepted names, parsed once at the edge (flags, text-format config) with the same message
// everywhere: "--dist 'mesh': expected replicated, layerwise, distopt or fsdp". Fields whose
// choices are an optimizer's own (schedule, Muon scale rule, Newton-Schulz dtype, clip mode) use the
// optimizers' enums directly, so the trainer passes them on without converting.
//
// The --dist table (kDistModes) also says what each mode implies for the libraries: it is the one
// place the trainer, the preflight and the validation read a mode's properties from.
//
// No LibTorch.
#ifndef ORTHOSHARD_INTEGRATION_CONFIG_CHOICES_H_
#define ORTHOSHARD_INTEGRATION_CONFIG_CHOICES_H_

#include <array>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "layout/layout.h"
#include "optimizers/kinds.h"
#include "optimizers/schedule.h"

namespace orthoshard::integration {

// --dist: how the ranks share the params, grads and optimizer state.
enum class DistMode { kReplicated, kLayerwise, kDistOpt, kFsdp };
// --device: where the ranks compute and communicate (Gloo on the CPU, NCCL on GPUs).
enum class Device { kCpu, kCuda };
// --precision: the dtype of params and activations (fp32 main params and state either way).
enum class Precision { kFp32, kBf16 };
// --optimizer: Muon for hidden matrices and AdamW for the rest, or AdamW for everything.
enum class OptimizerChoice { kMuon, kAdamW };
// --muon_ns_form: how Newton-Schulz is evaluated for elongated matrices.
enum class NsForm { kAuto, kDirect, kGram };
// --resume: continue from --save_dir's checkpoint, start afresh, or whichever applies.
enum class ResumeMode { kFalse, kTrue, kAuto };
// --fsdp_grad_accum: how --dist=fsdp accumulates gradients over micro-batches (full grads reduced
// once, or each micro-batch reduce-scattered into the shards: ddp::GradAccumulation).
enum class FsdpGradAccum { kFull, kSharded };
// --on_save_failure: what a failed checkpoint save does to the run.
enum class SaveFailurePolicy { kStop, kContinue };
// --sample_order: which samples an epoch trains on (data::SampleOrder, which setup passes on).
enum class SampleOrder { kWindows, kDocuments };
// --recompute: which activations backward computes again instead of keeping them (Megatron-LM's
// recompute granularities; model::Gpt::RecomputeGranularity).
enum class RecomputeMode { kNone, kFull, kSelective };

// One accepted value of a fixed-choice field and its name on the command line.
template <typename E>
struct Choice {
  E value;
  const char* name;
};

// What a --dist mode implies, for the libraries and the checks (one row per mode).
struct DistModeSpec {
  DistMode value;
  const char* name;
  // Where Muon's matrices are laid out: kLayerwise (shard-aligned: every matrix whole on one
  // owner) or kDistOpt (the byte-level ZeRO-1 layout for every param: Muon cannot run).
  layout::Strategy muon_strategy;
  // Grads reduce-scattered to their owners and params gathered back (false: grads all-reduced,
  // every rank steps every param, nothing gathered).
  bool sharded_step;
  // ZeRO-3: each rank keeps only its shard of params and grads between uses.
  bool sharded_params;
  // What a rank holds, in words (the preflight's memory message).
  const char* rank_holds;
};

inline constexpr std::array<DistModeSpec, 4> kDistModes = {{
    {DistMode::kReplicated, "replicated", layout::Strategy::kLayerwise, false, false,
     "params, grads and optimizer state"},
    {DistMode::kLayerwise, "layerwise", layout::Strategy::kLayerwise, true, false,
     "params and grads, its shard of the state"},
    {DistMode::kDistOpt, "distopt", layout::Strategy::kDistOpt, true, false,
     "params and grads, its shard of the state"},
    {DistMode::kFsdp, "fsdp", layout::Strategy::kLayerwise, true, true,
     "its shard of params, grads and state"},
}};

// The row of `mode` in kDistModes.
const DistModeSpec& SpecOf(DistMode mode);

// The accepted values of each fixed-choice type, in the order --help lists them.
template <typename E>
struct ChoiceTable;

template <>
struct ChoiceTable<DistMode> {
  static constexpr const std::array<DistModeSpec, 4>& kValues = kDistModes;
};
template <>
struct ChoiceTable<Device> {
  static constexpr std::array<Choice<Device>, 2> kValues = {{{Device::kCpu, "cpu"},
                                                             {Device::kCuda, "cuda"}}};
};
template <>
struct ChoiceTable<Precision> {
  static constexpr std::array<Choice<Precision>, 2> kValues = {
      {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
};
template <>
struct ChoiceTable<OptimizerChoice> {
  static constexpr std::array<Choice<OptimizerChoice>, 2> kValues = {
      {{OptimizerChoice::kMuon, "muon"}, {OptimizerChoice::kAdamW, "adamw"}}};
};
template <>
struct ChoiceTable<optimizers::MuonScaleRule> {
  static constexpr std::array<Choice<optimizers::MuonScaleRule>, 3> kValues = {
      {{optimizers::MuonScaleRule::kOriginal, "original"},
       {optimizers::MuonScaleRule::kMatchRmsAdamW, "match_rms_adamw"},
       {optimizers::MuonScaleRule::kSpectral, "spectral"}}};
};
template <>
struct ChoiceTable<optimizers::MuonTpMode> {
  static constexpr std::array<Choice<optimizers::MuonTpMode>, 3> kValues = {
      {{optimizers::MuonTpMode::kOwner, "owner"},
       {optimizers::MuonTpMode::kDuplicated, "duplicated"},
       {optimizers::MuonTpMode::kBlockwise, "blockwise"}}};
};
template <>
struct ChoiceTable<SampleOrder> {
  static constexpr std::array<Choice<SampleOrder>, 2> kValues = {
      {{SampleOrder::kWindows, "windows"}, {SampleOrder::kDocuments, "documents"}}};
};
template <>
struct ChoiceTable<FsdpGradAccum> {
  static constexpr std::array<Choice<FsdpGradAccum>, 2> kValues = {
      {{FsdpGradAccum::kFull, "full"}, {FsdpGradAccum::kSharded, "sharded"}}};
};
template <>
struct ChoiceTable<optimizers::NsDType> {
  static constexpr std::array<Choice<optimizers::NsDType>, 2> kValues = {
      {{optimizers::NsDType::kBFloat16, "bf16"}, {optimizers::NsDType::kFloat32, "fp32"}}};
};
template <>
struct ChoiceTable<NsForm> {
  static constexpr std::array<Choice<NsForm>, 3> kValues = {
      {{NsForm::kAuto, "auto"}, {NsForm::kDirect, "direct"}, {NsForm::kGram, "gram"}}};
};
template <>
struct ChoiceTable<optimizers::ClipMode> {
  static constexpr std::array<Choice<optimizers::ClipMode>, 2> kValues = {
      {{optimizers::ClipMode::kAllBeforeMomentum, "all"},
       {optimizers::ClipMode::kExcludeMuon, "exclude_muon"}}};
};
template <>
struct ChoiceTable<optimizers::ScheduleKind> {
  static constexpr std::array<Choice<optimizers::ScheduleKind>, 4> kValues = {
      {{optimizers::ScheduleKind::kConstant, "constant"},
       {optimizers::ScheduleKind::kWarmupCosine, "cosine"},
       {optimizers::ScheduleKind::kWarmupLinear, "linear"},
       {optimizers::ScheduleKind::kWsd, "wsd"}}};
};
template <>
struct ChoiceTable<ResumeMode> {
  static constexpr std::array<Choice<ResumeMode>, 3> kValues = {
      {{ResumeMode::kTrue, "true"}, {ResumeMode::kFalse, "false"}, {ResumeMode::kAuto, "auto"}}};
};
template <>
struct ChoiceTable<RecomputeMode> {
  static constexpr std::array<Choice<RecomputeMode>, 3> kValues = {
      {{RecomputeMode::kNone, "none"},
       {RecomputeMode::kFull, "full"},
       {RecomputeMode::kSelective, "selective"}}};
};
template <>
struct ChoiceTable<SaveFailurePolicy> {
  static constexpr std::array<Choice<SaveFailurePolicy>, 2> kValues = {
      {{SaveFailurePolicy::kStop, "stop"}, {SaveFailurePolicy::kContinue, "continue"}}};
};

// Whether T is a fixed-choice type (has a ChoiceTable).
template <typename T, typename = void>
struct IsChoice : std::false_type {};
template <typename T>
struct IsChoice<T, std::void_t<decltype(ChoiceTable<T>::kValues)>> : std::true_type {};
template <typename T>
inline constexpr bool kIsChoice = IsChoice<T>::value;

// The name of `value` ("layerwise"); "?" for a value outside the table (a cast integer).
template <typename E>
const char* ChoiceName(E value) {
  for (const auto& choice : ChoiceTable<E>::kValues) {
    if (choice.value == value) return choice.name;
  }
  return "?";
}

// "replicated, layerwise, distopt or fsdp".
template <typename E>
std::string ChoiceList() {
  const auto& values = ChoiceTable<E>::kValues;
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : i + 1 == values.size() ? " or " : ", ", values[i].name);
  }
  return out;
}

// The value named `text` of field `field`. Errors: kInvalidArgument
// "--<field> '<text>': expected <ChoiceList>".
template <typename E>
absl::StatusOr<E> ParseChoice(absl::string_view field, absl::string_view text) {
  for (const auto& choice : ChoiceTable<E>::kValues) {
    if (text == choice.name) return choice.value;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", field, " '", text, "': expected ", ChoiceList<E>()));
}

// How a field is spelled where it arrives as text or a proto scalar (a flag, a config file): a
// fixed-choice field by its name, any other field as itself.
template <typename T, typename = void>
struct Spelling {
  using type = T;
};
template <typename T>
struct Spelling<T, std::enable_if_t<kIsChoice<T>>> {
  using type = std::string;
};
template <typename T>
using SpellingOf = typename Spelling<T>::type;

// `value` as spelled (see Spelling).
template <typename T>
SpellingOf<T> Spell(const T& value) {
  if constexpr (kIsChoice<T>) {
    return ChoiceName(value);
  } else {
    return value;
  }
}

// Sets *out to the value `spelled` spells for field `field`. Errors: ParseChoice's for a
// fixed-choice field; none for the others.
template <typename T, typename S>
absl::Status SetFromSpelling(absl::string_view field, const S& spelled, T* out) {
  if constexpr (kIsChoice<T>) {
    absl::StatusOr<T> value = ParseChoice<T>(field, spelled);
    if (!value.ok()) return value.status();
    *out = *value;
  } else {
    *out = static_cast<T>(spelled);
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_CONFIG_CHOICES_H_
