// TrainerConfig: parsing the text-format proto, validation, and the summary's JSON.
#include "integration/config/trainer_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "common/status_macros.h"
#include "integration/config/field_checks.h"
#include "integration/config/pretrain_config.pb.h"
#include "model/gpt_config.h"
#include "optimizers/ns_schedule.h"

namespace orthoshard::integration {

using ::orthoshard::model::GptConfig;
using ::orthoshard::model::GptPreset;
using internal_config::kMaxKernelScalar;
using internal_config::kMaxMuonShapeScale;
using internal_config::ValidateDoubleRanges;
using internal_config::ValidateGivenFlags;
namespace {

// Collects the text-format parser's errors instead of logging them.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", field, " must be >= 1, got ", value));
}

absl::Status NonNegative(absl::string_view field, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", field, " must be >= 0, got ", value));
}

}  // namespace

const DistModeSpec& SpecOf(DistMode mode) {
  for (const DistModeSpec& spec : kDistModes) {
    if (spec.value == mode) return spec;
  }
  return kDistModes[static_cast<size_t>(DistMode::kLayerwise)];  // unreachable for a DistMode
}

absl::Status ApplyConfigText(absl::string_view text, absl::string_view name,
                             TrainerConfig* config) {
  PretrainConfig proto;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &proto)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", name, "': ", errors.first().empty() ? "does not parse"
                                                                    : errors.first()));
  }
  TrainerConfig c = *config;
  absl::Status status;
#define ORTHOSHARD_APPLY(type, name, default_value, help)                   \
  if (status.ok() && proto.has_##name()) {                                  \
    status = SetFromSpelling(#name, proto.name(), &c.name);                 \
    c.given.insert(#name);                                                  \
  }
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_APPLY)
#undef ORTHOSHARD_APPLY
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config '", name, "': ", status.message()));
  }
  *config = std::move(c);
  return absl::OkStatus();
}

namespace {

// Checkpointing, resume and stopping.
absl::Status ValidateRunControl(const TrainerConfig& c) {
  if ((c.resume != ResumeMode::kFalse || c.save_every > 0) && c.save_dir.empty()) {
    return absl::InvalidArgumentError(c.resume != ResumeMode::kFalse
                                          ? "--resume needs --save_dir (the checkpoint root)"
                                          : "--save_every needs --save_dir");
  }
  if (c.max_consecutive_skips < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_consecutive_skips must be >= 0 (0 = never stop), got ", c.max_consecutive_skips));
  }
  if (c.max_consecutive_failed_saves < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_consecutive_failed_saves must be >= 0 (0 = never stop), got ",
                     c.max_consecutive_failed_saves));
  }
  RETURN_IF_ERROR(Positive("steps", c.steps));  // before --stop_after's bound
  if (c.save_every < 0 || c.stop_after < 0 || c.keep_checkpoints < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--save_every, --stop_after and --keep_checkpoints must be >= 0, got ", c.save_every, ", ",
        c.stop_after, ", ", c.keep_checkpoints));
  }
  if (c.stop_after > c.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stop_after ", c.stop_after, " exceeds --steps ", c.steps));
  }
  return absl::OkStatus();
}

// The optimizers' choices and fractions, and which optimizer the --dist mode can run.
absl::Status ValidateOptimizer(const TrainerConfig& c) {
  RETURN_IF_ERROR(RouteOverrides(c).status());
  if (c.muon_ns_steps < 1 || c.muon_ns_steps >= 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--muon_ns_steps must be in [1, 100), got ", c.muon_ns_steps));
  }
  absl::StatusOr<optimizers::NsSchedule> ns = optimizers::ParseNsSchedule(c.muon_ns_coefficients);
  if (ns.ok()) {
    if (absl::Status bounded =
            optimizers::CheckNsScheduleBounded(ns->coefficients, ns->norm_scale, c.muon_ns_steps,
                                               ns->cycle);
        !bounded.ok()) {
      ns = absl::InvalidArgumentError(absl::StrCat("'", c.muon_ns_coefficients,
                                                   "' with --muon_ns_steps ", c.muon_ns_steps, ": ",
                                                   bounded.message()));
    }
  }
  if (!ns.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--muon_ns_coefficients: ", ns.status().message()));
  }
  if (c.muon_ns_form == NsForm::kGram && c.muon_ns_dtype != optimizers::NsDType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--muon_ns_form=gram needs --muon_ns_dtype=fp32 (got ", ChoiceName(c.muon_ns_dtype),
        "): the Gram form carries its Gram matrix between steps, so low-precision rounding is "
        "never corrected"));
  }
  if (SpecOf(c.dist).muon_strategy == layout::Strategy::kDistOpt &&
      c.optimizer == OptimizerChoice::kMuon) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dist=", ChoiceName(c.dist),
        " shards every param at element level, but Muon needs whole matrices: use "
        "--optimizer=adamw with it, or --dist=layerwise (Muon layer-wise + ZeRO-1 AdamW)"));
  }
  return absl::OkStatus();
}

// The most lr x weight decay may be: each step multiplies the params by 1 - lr x wd (the lr
// schedule only lowers it); in [0, 2] that factor's magnitude is at most 1, beyond 2 it exceeds 1
// and the params grow geometrically, leaving fp32's range within 128 / log2|1 - lr x wd| steps
// whatever the gradients.
constexpr double kMaxLrTimesDecay = 2;

// lr, weight decay and the Muon scale together (each is within its own DoubleRange already):
// every scalar the optimizers derive from them stays representable far inside fp32
// (kMaxLrTimesDecay above, field_checks.h's kMaxKernelScalar and kMaxMuonShapeScale).
absl::Status ValidateStepScalars(const TrainerConfig& c) {
  for (auto [field, value, lr_field, lr] :
       {std::tuple<const char*, double, const char*, double>{"weight_decay", c.weight_decay, "lr",
                                                             c.lr},
        {"muon_weight_decay", c.muon_weight_decay, "muon_lr", c.muon_lr}}) {
    if (!(lr * value <= kMaxLrTimesDecay)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", lr_field, " ", lr, " x --", field, " ", value, " = ", lr * value,
          " exceeds 2 (the decay multiplies params by 1 - lr x wd each step; beyond 2 they grow "
          "geometrically out of fp32's range); accepted --", lr_field, " with this --", field,
          ": (0, ", kMaxLrTimesDecay / value, "]"));
    }
  }
  // AdamW's step size lr_t / (1 - beta1^t) is largest at t = 1, where it is lr / (1 - beta1).
  if (const double step_size = c.lr / (1.0 - c.adam_beta1); !(step_size <= kMaxKernelScalar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr ", c.lr, ": AdamW's first step size --lr / (1 - --adam_beta1 ",
                     c.adam_beta1, ") = ", step_size,
                     " exceeds 2^64 (an fp32 kernel's scalar, with 2^64 of headroom); "
                     "accepted --lr with this --adam_beta1: (0, ",
                     kMaxKernelScalar * (1.0 - c.adam_beta1), "]"));
  }
  // Muon's adjusted lr is muon_lr x the rule's scale for the matrix's shape.
  const double rule_factor = c.muon_scale_rule == optimizers::MuonScaleRule::kOriginal ? 1.0
                             : c.muon_scale_rule == optimizers::MuonScaleRule::kMatchRmsAdamW
                                 ? 0.2
                                 : c.muon_extra_scale;
  if (const double most = c.muon_lr * rule_factor * kMaxMuonShapeScale;
      !(most <= kMaxKernelScalar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--muon_lr ", c.muon_lr,
                     " x the largest lr scale of --muon_scale_rule=", ChoiceName(c.muon_scale_rule),
                     " (", rule_factor, " x 2^25, a param of 2^50 elements) = ", most,
                     " exceeds 2^64 (an fp32 kernel's scalar, with 2^64 of headroom); accepted "
                     "--muon_lr x the rule's factor: (0, 2^39 = ",
                     kMaxKernelScalar / kMaxMuonShapeScale, "]"));
  }
  return absl::OkStatus();
}

// Counts that must be positive or non-negative.
absl::Status ValidateCounts(const TrainerConfig& c) {
  for (auto [field, value] : {std::pair<const char*, int64_t>{"steps", c.steps},
                              {"global_batch", c.global_batch},
                              {"micro_batches", c.micro_batches},
                              {"eval_batches", c.eval_batches},
                              {"max_bucket_elems", c.max_bucket_elems},
                              {"log_every", c.log_every},
                              {"distributed_timeout_s", c.distributed_timeout_s}}) {
    RETURN_IF_ERROR(Positive(field, value));
  }
  for (auto [field, value] : {std::pair<const char*, int64_t>{"seq_len", c.seq_len},
                              {"warmup_steps", c.warmup_steps},
                              {"decay_steps", c.decay_steps},
                              {"eval_every", c.eval_every},
                              {"check_every", c.check_every},
                              {"num_threads", c.num_threads},
                              {"min_buckets", c.min_buckets},
                              {"bucket_elems", c.bucket_elems},
                              {"fsdp_grad_syncs_in_flight", c.fsdp_grad_syncs_in_flight},
                              {"target_buckets", c.target_buckets}}) {
    RETURN_IF_ERROR(NonNegative(field, value));
  }
  return absl::OkStatus();
}

// --profile_step_start / --profile_step_end / --profile_dir.
absl::Status ValidateProfiling(const TrainerConfig& c) {
  if (c.profile_step_start < 0 || c.profile_step_end < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile_step_start ", c.profile_step_start, " / --profile_step_end ",
        c.profile_step_end, ": expected steps >= 1 (0 = off / the start step)"));
  }
  if (c.profile_step_start == 0) {
    if (c.profile_step_end == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile_step_end ", c.profile_step_end, " without --profile_step_start"));
  }
  if (c.profile_step_end != 0 && c.profile_step_end < c.profile_step_start) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile_step_end ", c.profile_step_end, " precedes --profile_step_start ",
                     c.profile_step_start));
  }
  if (c.profile_step_start > c.steps) {
    return absl::InvalidArgumentError(absl::StrCat("--profile_step_start ", c.profile_step_start,
                                                   " is after the last step (--steps ", c.steps,
                                                   "): nothing would be profiled"));
  }
  if (c.profile_dir.empty() && c.log_dir.empty()) {
    return absl::InvalidArgumentError(
        "--profile_step_start needs --profile_dir (or --log_dir) for the traces");
  }
  return absl::OkStatus();
}

// Tensor parallelism: --tp splits the world, and the heads, KV groups, FFN width and vocabulary of
// a dense preset (the vocabulary checked here is --vocab_size's or the preset's; a dataset's own
// is checked when the model is built).
absl::Status ValidateTensorParallel(const TrainerConfig& c, int world_size) {
  if (c.tp < 1 || world_size % c.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", c.tp, " must be >= 1 and divide the world size ", world_size));
  }
  if (c.tp == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(GptConfig preset, GptPreset(c.model));
  if (preset.is_moe()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", c.tp, ": tensor parallelism is not supported with mixture-of-experts model '",
        c.model, "' yet (use --ep to split the experts)"));
  }
  if (c.vocab_size > 0) preset.vocab_size = c.vocab_size;
  if (absl::Status split = model::ValidateTensorParallel(preset, static_cast<int>(c.tp));
      !split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp ", c.tp, " for model '", c.model, "': ", split.message()));
  }
  return absl::OkStatus();
}

// --recompute and --recompute_layers (a count of the preset's blocks).
absl::Status ValidateRecompute(const TrainerConfig& c) {
  if (c.recompute_layers == -1) return absl::OkStatus();
  if (c.recompute == RecomputeMode::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recompute_layers ", c.recompute_layers,
                     " needs --recompute=full or --recompute=selective (it says how many blocks "
                     "recompute)"));
  }
  ASSIGN_OR_RETURN(const GptConfig preset, GptPreset(c.model));
  if (c.recompute_layers < 1 || c.recompute_layers > preset.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute_layers ", c.recompute_layers, " must be in [1, ", preset.num_layers,
        "] (model '", c.model, "' has ", preset.num_layers, " layers), or -1 for every layer"));
  }
  return absl::OkStatus();
}

// The model preset, the batch shape over the ranks, and the data's ids and eval split.
// `world_size` here is the data-parallel size (world / tp): the ranks that read different data.
absl::Status ValidateModelAndBatch(const TrainerConfig& c, int world_size) {
  absl::StatusOr<GptConfig> preset = GptPreset(c.model);
  if (!preset.ok()) return preset.status();
  if (c.seq_len > preset->max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("--seq_len ", c.seq_len, " exceeds model '",
                                                   c.model, "' max_seq_len ",
                                                   preset->max_seq_len));
  }
  // world_size x micro_batches must divide global_batch (>= 1), so it is at most global_batch;
  // checking that by division first keeps the product from overflowing.
  const bool fits = c.micro_batches <= c.global_batch / world_size;
  if (!fits || c.global_batch % (static_cast<int64_t>(world_size) * c.micro_batches) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global_batch ", c.global_batch, " is not divisible by ",
        c.tp > 1 ? "data-parallel size (world / --tp) " : "world size ", world_size,
        " x --micro_batches ", c.micro_batches,
        fits ? absl::StrCat(" = ", static_cast<int64_t>(world_size) * c.micro_batches)
             : std::string(" (the product exceeds --global_batch)")));
  }
  if (c.vocab_size < 0 || c.vocab_size > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_size must be 0 (the data's or the preset's) or in [1, 2^31], got ",
                     c.vocab_size));
  }
  if (c.eod_token < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eod_token must be a token id (>= 0) or -1 (the data's, if any), got ", c.eod_token));
  }
  return absl::OkStatus();
}

// Mixture of experts: the flags need an MoE preset, --ep splits the world and the experts.
absl::Status ValidateExperts(const TrainerConfig& c, int world_size) {
  ASSIGN_OR_RETURN(const GptConfig preset, GptPreset(c.model));
  // Set to another value or given at all (--ep=1 on a dense model does nothing either).
  const bool moe_flags = c.ep != 1 || c.moe_top_k != 0 || c.moe_aux_loss_coeff != -1 ||
                         c.moe_z_loss_coeff != -1 || c.given.count("ep") ||
                         c.given.count("moe_top_k") || c.given.count("moe_aux_loss_coeff") ||
                         c.given.count("moe_z_loss_coeff");
  if (!preset.is_moe()) {
    if (!moe_flags) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "--ep, --moe_top_k, --moe_aux_loss_coeff and --moe_z_loss_coeff need a mixture-of-experts "
        "model, but '", c.model, "' is dense (MoE presets: moe-tiny, moe-tiny-shared, moe-small)"));
  }
  if (c.ep < 1 || world_size % c.ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ep ", c.ep,
                                                   " must be >= 1 and divide the world size ",
                                                   world_size));
  }
  if (preset.num_experts % c.ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ep ", c.ep, " does not divide model '",
                                                   c.model, "''s ", preset.num_experts,
                                                   " experts per layer"));
  }
  if (c.moe_top_k < 0 || c.moe_top_k > preset.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe_top_k ", c.moe_top_k, " must be in [1, ", preset.num_experts, "] (model '", c.model,
        "''s experts per layer), or 0 for the preset's ", preset.moe_top_k));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrainerConfig(const TrainerConfig& c, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be >= 1, got ", world_size));
  }
  RETURN_IF_ERROR(ValidateDoubleRanges(c));
  RETURN_IF_ERROR(ValidateRunControl(c));
  RETURN_IF_ERROR(ValidateOptimizer(c));
  RETURN_IF_ERROR(ValidateStepScalars(c));
  RETURN_IF_ERROR(ValidateCounts(c));
  RETURN_IF_ERROR(ValidateProfiling(c));
  if (c.fsdp_grad_accum == FsdpGradAccum::kSharded && c.dist != DistMode::kFsdp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fsdp_grad_accum=sharded adds each micro-batch's reduce-scatter into this rank's grad "
        "shards: it needs --dist=fsdp, got --dist=", SpecOf(c.dist).name));
  }
  RETURN_IF_ERROR(ValidateTensorParallel(c, world_size));
  const int dp = world_size / static_cast<int>(c.tp);
  RETURN_IF_ERROR(ValidateModelAndBatch(c, dp));
  RETURN_IF_ERROR(ValidateRecompute(c));
  RETURN_IF_ERROR(ValidateExperts(c, dp));
  return ValidateGivenFlags(c);
}

namespace {

// "max_persistent_bytes":N,"max_peak_transient_bytes":N,"memory":[{"rank":0,...},...].
std::string MemoryJson(const std::vector<RankMemory>& memory) {
  int64_t max_persistent = 0, max_transient = 0;
  std::vector<std::string> ranks;
  for (size_t r = 0; r < memory.size(); ++r) {
    const RankMemory& m = memory[r];
    max_persistent = std::max(max_persistent, m.persistent_bytes());
    max_transient = std::max(max_transient, m.peak_transient_bytes);
    const std::string experts =
        m.expert_params_bytes > 0
            ? absl::StrFormat(",\"expert_params_bytes\":%d,\"expert_grads_bytes\":%d,"
                              "\"expert_state_bytes\":%d,\"ns_cost\":%d",
                              m.expert_params_bytes, m.expert_grads_bytes, m.expert_state_bytes,
                              m.ns_cost)
            : "";
    ranks.push_back(absl::StrFormat(
        "{\"rank\":%d,\"params_bytes\":%d,\"grads_bytes\":%d,\"optimizer_state_bytes\":%d,"
        "\"peak_transient_bytes\":%d,\"max_rss_bytes\":%d,\"allocator_peak_bytes\":%d,"
        "\"param_buffer_bytes\":%d,\"peak_transient_over_param_buffer\":%.4f,"
        "\"transient_bound_bytes\":%d%s}",
        r, m.params_bytes, m.grads_bytes, m.optimizer_state_bytes, m.peak_transient_bytes,
        m.max_rss_bytes, m.allocator_peak_bytes, m.param_buffer_bytes,
        m.peak_transient_over_param_buffer(), m.transient_bound_bytes, experts));
  }
  return absl::StrFormat(
      "\"max_persistent_bytes\":%d,\"max_peak_transient_bytes\":%d,\"memory\":[%s]", max_persistent,
      max_transient, absl::StrJoin(ranks, ","));
}

}  // namespace

namespace {

// The summary's "key":value members in order. JSON has no NaN or infinity (RFC 8259, section 6):
// a double that is not finite is written as null and its key listed in non_finite(). The strings
// are fixed identifiers (no escaping needed).
class JsonMembers {
 public:
  void Int(absl::string_view key, int64_t value) { Add(key, absl::StrCat(value)); }
  void String(absl::string_view key, absl::string_view value) {
    Add(key, absl::StrCat("\"", value, "\""));
  }
  // %.{digits}f, or %.{digits}g with `general`.
  void Double(absl::string_view key, double value, int digits, bool general = false) {
    if (!std::isfinite(value)) {
      non_finite_.push_back(absl::StrCat("\"", key, "\""));
      Add(key, "null");
      return;
    }
    Add(key, general ? absl::StrFormat("%.*g", digits, value)
                     : absl::StrFormat("%.*f", digits, value));
  }
  void Raw(absl::string_view members) { members_.emplace_back(members); }
  // ["final_loss",...]: the keys written as null; empty when every double was finite.
  std::string non_finite() const {
    return absl::StrCat("[", absl::StrJoin(non_finite_, ","), "]");
  }
  bool all_finite() const { return non_finite_.empty(); }
  std::string Object() const { return absl::StrCat("{", absl::StrJoin(members_, ","), "}"); }

 private:
  void Add(absl::string_view key, absl::string_view value) {
    members_.push_back(absl::StrCat("\"", key, "\":", value));
  }
  std::vector<std::string> members_;
  std::vector<std::string> non_finite_;
};

}  // namespace

std::string TrainSummary::ToJson() const {
  JsonMembers j;
  j.Int("steps", steps);
  j.Double("initial_loss", initial_loss, 6);
  j.Double("final_loss", final_loss, 6);
  j.Double("initial_eval_loss", initial_eval_loss, 6);
  j.Double("eval_loss", eval_loss, 6);
  j.Double("unigram_entropy", unigram_entropy, 6);
  j.Double("tokens_per_s", tokens_per_s, 1);
  j.Double("elapsed_s", elapsed_s, 3);
  j.Int("world_size", world_size);
  j.Int("tp", tp);
  j.String("dist", dist);
  j.String("recompute", recompute);
  if (recompute_layers >= 0) j.Int("recompute_layers", recompute_layers);
  j.String("model", model);
  j.String("optimizer", optimizer);
  j.Int("num_params", num_params);
  j.Int("skipped_steps", skipped_steps);
  j.Int("comm_bytes", comm_bytes);
  j.Int("checksum_checks", checksum_checks);
  j.Int("failed_saves", failed_saves);
  j.Int("stop_signal", stop_signal);
  j.Double("param_checksum", param_checksum, 17, /*general=*/true);  // %.17g round-trips
  j.Int("comm_bytes_per_step", comm_bytes_per_step);
  j.Int("wire_bytes_per_step", wire_bytes_per_step);
  j.Double("param_gather_wait_s", param_gather_wait_s, 6);
  j.Double("grad_sync_wait_s", grad_sync_wait_s, 6);
  j.Double("exposed_comm_s", exposed_comm_s, 6);
  j.Double("rank_skew_s", rank_skew_s, 6);
  j.Double("step_s", step_s, 6);
  j.Double("forward_s", forward_s, 6);
  j.Double("backward_s", backward_s, 6);
  j.Double("optimizer_s", optimizer_s, 6);
  j.Double("cpu_s_per_step", cpu_s_per_step, 6);
  j.Int("param_buffer_bytes", param_buffer_bytes);
  // -1 (not asked for) leaves them out; NaN is not >= 0 but was asked for: null.
  if (!(params_norm < 0)) j.Double("params_norm", params_norm, 9, /*general=*/true);
  if (num_zeros_in_grad >= 0) j.Int("num_zeros_in_grad", num_zeros_in_grad);
  if (moe) {
    j.Double("moe_aux_loss", moe_aux_loss, 6);
    j.Double("moe_z_loss", moe_z_loss, 6);
    j.Int("all_to_all_bytes_per_step", all_to_all_bytes_per_step);
    j.Int("all_to_all_wire_bytes_per_step", all_to_all_wire_bytes_per_step);
    auto list = [](const std::vector<double>& v) {
      std::vector<std::string> parts;
      for (double x : v) parts.push_back(absl::StrFormat("%.4f", x));
      return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
    };
    j.Raw(absl::StrCat("\"expert_load_max\":", list(expert_load_max)));
    j.Raw(absl::StrCat("\"expert_load_min\":", list(expert_load_min)));
  }
  if (qk_clip_clipped_groups >= 0) {
    j.Double("qk_clip_max_logit", qk_clip_max_logit, 6, /*general=*/true);
    j.Int("qk_clip_clipped_groups", qk_clip_clipped_groups);
  }
  j.Raw(MemoryJson(memory));
  if (!j.all_finite()) j.Raw(absl::StrCat("\"non_finite\":", j.non_finite()));
  return j.Object();
}

bool GramNewtonSchulz(const TrainerConfig& config) {
  return config.muon_ns_form == NsForm::kGram ||
         (config.muon_ns_form == NsForm::kAuto &&
          config.muon_ns_dtype == optimizers::NsDType::kFloat32);
}

absl::StatusOr<std::vector<RouteOverrideSpec>> RouteOverrides(const TrainerConfig& config) {
  std::vector<RouteOverrideSpec> out;
  for (absl::string_view entry : absl::StrSplit(config.route, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    const size_t eq = entry.rfind('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--route entry '", entry, "': expected GLOB=OPTIMIZER, e.g. '*experts*=adamw'"));
    }
    RouteOverrideSpec spec;
    spec.pattern = std::string(absl::StripAsciiWhitespace(entry.substr(0, eq)));
    ASSIGN_OR_RETURN(spec.optimizer, ParseChoice<OptimizerChoice>(
                                         "route", absl::StripAsciiWhitespace(entry.substr(eq + 1))));
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<std::string> NoWeightDecayPatterns(const TrainerConfig& config) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(config.no_weight_decay, ',')) {
    p = absl::StripAsciiWhitespace(p);
    if (!p.empty()) out.emplace_back(p);
  }
  return out;
}

void ResolveResumeAuto(TrainerConfig* config) {
  if (config->resume != ResumeMode::kAuto || config->save_dir.empty()) return;  // validation names it
  std::error_code ec;
  config->resume = std::filesystem::exists(config->save_dir + "/latest", ec) && !ec
                       ? ResumeMode::kTrue
                       : ResumeMode::kFalse;
}

}  // namespace orthoshard::integration
