// Fuzz target for the text-format config parser (integration/config/trainer_config.h): any bytes
// given to ApplyConfigText are either rejected with kInvalidArgument ("config 'NAME': ...") leaving
// the config untouched — because the text does not parse, or because a fixed-choice field names a
// value its table (choices.h) does not hold — or accepted with exactly the fields present in the
// text changed. Every accepted config then goes through ValidateTrainerConfig at several world
// sizes, which either rejects it with a message or accepts it with every documented bound holding
// (what Train and the checkpoint code then rely on). The seed corpus (testdata/fuzz/config) names
// every accepted value of every fixed-choice field; trainer_config_test checks that it does.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "integration/config/pretrain_config.pb.h"
#include "integration/config/trainer_config.h"
#include "model/gpt_config.h"
#include "optimizers/ns_schedule.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::model::GptConfig;
using ::orthoshard::model::GptPreset;

#define ORTHOSHARD_COUNT(type, name, default_value, help) +1
constexpr int kNumFields = 0 ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_COUNT);
#undef ORTHOSHARD_COUNT

void Check(bool ok) {
  if (!ok) std::abort();
}

// Equal, counting two NaNs as equal (a text "lr: nan" must arrive as NaN).
template <typename T>
bool Same(const T& a, const T& b) {
  return a == b;
}
bool Same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// A value of field number `i` that differs from every default (TrainerConfig's and the proto's).
void SetDistinct(std::string& v, int i) { v = absl::StrCat("v", i, "?"); }
void SetDistinct(int64_t& v, int i) { v = -101 - i; }
void SetDistinct(int& v, int i) { v = -101 - i; }
void SetDistinct(uint64_t& v, int i) { v = 0xfeedfacecafe0000ULL + i; }
void SetDistinct(double& v, int i) { v = -1.5 - i; }
void SetDistinct(bool& v, int) { v = !v; }
// A fixed-choice field: the table's next value (every table has at least two).
template <typename E, std::enable_if_t<kIsChoice<E>, int> = 0>
void SetDistinct(E& v, int) {
  const auto& values = ChoiceTable<E>::kValues;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].value == v) {
      v = values[(i + 1) % values.size()].value;
      return;
    }
  }
}

// What a proto field's value becomes in TrainerConfig (a choice's name: its value; the text named
// an accepted one, or ApplyConfigText would have failed).
template <typename T, typename S>
T Applied(const S& spelled) {
  T value{};
  Check(SetFromSpelling("field", spelled, &value).ok());
  return value;
}

// Whether some fixed-choice field of `proto` names a value its table does not hold.
bool NamesAnUnknownChoice(const PretrainConfig& proto) {
  bool unknown = false;
  TrainerConfig scratch;
#define ORTHOSHARD_UNKNOWN(type, name, default_value, help) \
  unknown = unknown || (proto.has_##name() && !SetFromSpelling(#name, proto.name(), &scratch.name).ok());
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_UNKNOWN)
#undef ORTHOSHARD_UNKNOWN
  return unknown;
}

// A config whose every field differs from both TrainerConfig's and the proto's defaults, so a field
// the parser writes without the text naming it shows up.
TrainerConfig Distinctive() {
  TrainerConfig c;
  int i = 0;
#define ORTHOSHARD_DISTINCT(type, name, default_value, help) SetDistinct(c.name, i++);
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_DISTINCT)
#undef ORTHOSHARD_DISTINCT
  return c;
}

// Discards the reference parser's errors (protobuf would log each one).
class SilentErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, int, const std::string&) override {}
  void AddWarning(int, int, const std::string&) override {}
};

bool SameConfig(const TrainerConfig& a, const TrainerConfig& b) {
  bool same = true;
#define ORTHOSHARD_SAME(type, name, default_value, help) same = same && Same(a.name, b.name);
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_SAME)
#undef ORTHOSHARD_SAME
  return same;
}

// The documented bounds of an accepted config (trainer_config.h, ValidateTrainerConfig).
void CheckAccepted(const TrainerConfig& c, int world_size) {
  // Every double field within its declared range.
  auto in_range = [](const char* field, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, double>) {
      const DoubleRange* range = DoubleRangeOf(field);
      Check(range != nullptr && range->Contains(value));
    }
  };
#define ORTHOSHARD_IN_RANGE(type, name, default_value, help) in_range(#name, c.name);
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_IN_RANGE)
#undef ORTHOSHARD_IN_RANGE
  // A given fsdp-only or tp-only flag is in its mode.
  Check(!c.given.count("fsdp_grad_syncs_in_flight") || c.dist == DistMode::kFsdp);
  Check(!c.given.count("muon_tp_mode") || c.tp > 1);
  Check(!(SpecOf(c.dist).muon_strategy == layout::Strategy::kDistOpt &&
          c.optimizer == OptimizerChoice::kMuon));
  Check(!((c.resume != ResumeMode::kFalse || c.save_every > 0) && c.save_dir.empty()));
  const absl::StatusOr<GptConfig> preset = GptPreset(c.model);
  Check(preset.ok());
  Check(c.steps >= 1 && c.global_batch >= 1 && c.micro_batches >= 1 && c.eval_batches >= 1 &&
        c.bucket_elems >= 0 && c.log_every >= 1 && c.distributed_timeout_s >= 1);
  Check(c.seq_len >= 0 && c.seq_len <= preset->max_seq_len);
  Check(c.warmup_steps >= 0 && c.decay_steps >= 0 && c.eval_every >= 0 && c.check_every >= 0 &&
        c.num_threads >= 0 && c.min_buckets >= 0 && c.fsdp_grad_syncs_in_flight >= 0);
  Check(c.fsdp_grad_accum == FsdpGradAccum::kFull || c.dist == DistMode::kFsdp);
  Check(c.bucket_padding >= 0 && c.bucket_padding <= 1 && c.max_bucket_padding >= 0 &&
        c.max_bucket_padding <= 1);
  Check(c.save_every >= 0 && c.stop_after >= 0 && c.stop_after <= c.steps &&
        c.keep_checkpoints >= 0 && c.max_consecutive_skips >= 0);
  Check(c.max_consecutive_failed_saves >= 0);
  // global_batch / world_size / micro_batches samples per micro-batch, exactly.
  Check(c.global_batch % world_size == 0 && (c.global_batch / world_size) % c.micro_batches == 0);
  Check(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1);
  Check(c.eval_fraction > 0 && c.eval_fraction < 1);
  Check(c.lr > 0 && std::isfinite(c.lr) && c.muon_lr > 0 && std::isfinite(c.muon_lr));
  Check(c.weight_decay >= 0 && std::isfinite(c.weight_decay));
  Check(c.muon_weight_decay >= 0 && std::isfinite(c.muon_weight_decay));
  Check(std::isfinite(c.max_grad_norm));
  Check(c.qk_clip_threshold >= 0 && std::isfinite(c.qk_clip_threshold));
  // The optimizers' scalars stay far inside fp32 (trainer_config.cc's bounds).
  Check(c.lr * c.weight_decay <= 2 && c.muon_lr * c.muon_weight_decay <= 2);
  Check(c.lr / (1 - c.adam_beta1) <= 0x1p64);
  const double rule_factor = c.muon_scale_rule == optimizers::MuonScaleRule::kOriginal ? 1.0
                             : c.muon_scale_rule == optimizers::MuonScaleRule::kMatchRmsAdamW
                                 ? 0.2
                                 : c.muon_extra_scale;
  Check(c.muon_lr * rule_factor <= 0x1p39);
  Check(c.adam_eps >= 0 && c.adam_eps <= 0x1p64);
  const absl::StatusOr<optimizers::NsSchedule> ns =
      optimizers::ParseNsSchedule(c.muon_ns_coefficients);
  Check(ns.ok() && optimizers::NsSingularValueBound(ns->coefficients, ns->norm_scale,
                                                    c.muon_ns_steps, ns->cycle) <= 16);
  Check(!ns->cycle || c.muon_ns_steps % static_cast<int>(ns->coefficients.size()) == 0);
}

int TestOneInput(const uint8_t* data, size_t size) {
  Check(PretrainConfig::descriptor()->field_count() == kNumFields);  // a new field is listed above
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  const TrainerConfig base = Distinctive();
  TrainerConfig applied = base;
  const absl::Status status = ApplyConfigText(text, "fuzz.textproto", &applied);

  // The same text through protobuf's parser alone: what ApplyConfigText should have applied.
  PretrainConfig proto;
  google::protobuf::TextFormat::Parser parser;
  SilentErrors errors;
  parser.RecordErrorsTo(&errors);
  const bool parses = parser.ParseFromString(std::string(text), &proto);
  if (!status.ok()) {
    Check(status.code() == absl::StatusCode::kInvalidArgument);
    Check(absl::StartsWith(status.message(), "config 'fuzz.textproto': ") &&
          status.message().size() > sizeof("config 'fuzz.textproto': ") - 1);
    Check(SameConfig(applied, base));
    Check(!parses || NamesAnUnknownChoice(proto));
    return 0;
  }
  Check(parses);
#define ORTHOSHARD_APPLIED(type, name, default_value, help)                     \
  Check(proto.has_##name() ? Same(applied.name, Applied<type>(proto.name()))     \
                           : Same(applied.name, base.name));
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_APPLIED)
#undef ORTHOSHARD_APPLIED

  // On top of the defaults, as pretrain does, then the checks that need no files or ranks.
  TrainerConfig config;
  Check(ApplyConfigText(text, "fuzz.textproto", &config).ok());
  for (int world_size : {1, 2, 3, 8, 1 << 20, 2147483647}) {
    const absl::Status valid = ValidateTrainerConfig(config, world_size);
    if (valid.ok()) {
      CheckAccepted(config, world_size);
    } else {
      Check(valid.code() == absl::StatusCode::kInvalidArgument);
      Check(!valid.message().empty());
    }
  }
  return 0;
}

}  // namespace
}  // namespace orthoshard::integration

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return orthoshard::integration::TestOneInput(data, size);
}
