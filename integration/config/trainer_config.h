// What a pretraining run is told and what it reports, as plain values with no LibTorch:
// TrainerConfig (one comment per field; fixed-choice fields typed by choices.h), the text-format
// config parser, the checks that need no files or ranks, and TrainSummary. The run itself is Train
// in trainer.h.
//
// Config comes from three places, later ones winning: TrainerConfig's defaults, a text-format
// `PretrainConfig` proto (pretrain_config.proto, ApplyConfigText), and command-line flags.
#ifndef ORTHOSHARD_INTEGRATION_CONFIG_TRAINER_CONFIG_H_
#define ORTHOSHARD_INTEGRATION_CONFIG_TRAINER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "integration/config/choices.h"
#include "integration/config/trainer_config_fields.h"

namespace orthoshard::integration {

// A run's settings. Each field, its default and its meaning are in trainer_config_fields.h.
struct TrainerConfig {
#define ORTHOSHARD_DECLARE_FIELD(type, name, default_value, help) type name = default_value;
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_DECLARE_FIELD)
#undef ORTHOSHARD_DECLARE_FIELD
  // The fields given explicitly, by name: a field of the --config text (ApplyConfigText adds it)
  // or a command-line flag (pretrain adds it). A flag that does nothing in the configured mode
  // (--muon_tp_mode at --tp 1) is refused when given, while its default stays valid in every mode.
  std::set<std::string> given;
};

// The accepted values of a double-valued field: [min, max], either end open, and `sentinel` too
// where the field has one (-1: the MoE weights' "the default"). `why` says where the bounds come
// from (field_checks.cc derives each).
struct DoubleRange {
  double min = 0, max = 0;
  bool min_open = false, max_open = false;
  std::optional<double> sentinel;
  const char* why = "";
  bool Contains(double value) const;
  // "[0, 1)", "(0, 2^64]", "[0, 2^32] or -1", "finite" (the whole of a double's finite range).
  std::string ToString() const;
};

// The declared range of the double field `field` (trainer_config_fields.h's name), or nullptr for
// a field that has none (every double field has one: trainer_config_test enumerates them).
const DoubleRange* DoubleRangeOf(absl::string_view field);

// Fills `config` from a text-format orthoshard.integration.PretrainConfig: only fields present in
// the text are changed, and nothing is on error. Errors: kInvalidArgument with the parser's message
// (line:column) for text that does not parse ("config 'x': 3:1: Message type ... has no field
// named \"stepz\""), or naming a fixed-choice field's unknown value ("config 'x': --dist 'mesh':
// expected replicated, layerwise, distopt or fsdp").
absl::Status ApplyConfigText(absl::string_view text, absl::string_view name, TrainerConfig* config);

// Checks values that need no files or ranks. Every double field is first checked against its
// DoubleRange ("--moe_z_loss_coeff must be in [0, 2^32] or -1, got 1e+300: ..."; a double field
// without one is kInternal). A flag in config.given that does nothing in the configured mode is
// refused, naming it and what it needs ("--muon_tp_mode needs --tp > 1 and --optimizer=muon ...").
// Errors: kInvalidArgument naming the field and its bound (steps >= 1, a known preset, batch divisibility by world_size x micro_batches, seq_len <=
// the preset's max_seq_len, eval_fraction in (0, 1), max_grad_norm or qk_clip_threshold not finite
// (or the latter negative), distopt with muon,
// --resume or --save_every without --save_dir, stop_after > steps, ...). Beyond each double field's
// own range, the values that reach an fp32 computation together are bounded (trainer_config.cc and
// ns_schedule.h): lr x weight decay <= 2, AdamW's first step size lr / (1 - beta1) <= 2^64, muon_lr x the scale
// rule's largest factor <= 2^64, adam_eps <= 2^64, Newton-Schulz coefficients within +-1024 that
// keep the iterate's singular values within [0, 16] over --muon_ns_steps; the message names the
// flag, its value and the accepted range. Fixed-choice fields hold a valid value by their type.
// Whether this build and machine can run cuda is the caller's check.
absl::Status ValidateTrainerConfig(const TrainerConfig& config, int world_size);

// Whether the run continues from a checkpoint: --resume=true (after ResolveResumeAuto, also an
// --resume=auto that found one).
inline bool Resuming(const TrainerConfig& config) { return config.resume == ResumeMode::kTrue; }

// Turns --resume=auto into true when --save_dir holds a `latest` pointer, else false; other values
// are left alone. Every rank decides alike (the same file system, read before any rank writes).
void ResolveResumeAuto(TrainerConfig* config);

// Whether Muon's Newton-Schulz runs in the Gram form (NewtonSchulzOptions::gram) for the matrices
// where it saves work: --muon_ns_form=gram, or auto with the fp32 iteration (torch.optim.Muon has
// no fp32 iteration to be bitwise with; over 300 steps of `small` and 150 of gpt2-124m on an H200
// its eval losses were within 0.0025 of the direct form's, or lower: README, GPU).
bool GramNewtonSchulz(const TrainerConfig& config);

// One --route entry: params whose name matches the glob go to that optimizer.
struct RouteOverrideSpec {
  std::string pattern;
  OptimizerChoice optimizer = OptimizerChoice::kMuon;
};
// --route split at commas (blanks trimmed, empty entries dropped), in order. Errors:
// kInvalidArgument naming an entry without '=' or with an unknown optimizer.
absl::StatusOr<std::vector<RouteOverrideSpec>> RouteOverrides(const TrainerConfig& config);

// --no_weight_decay split at commas, blanks trimmed, empty entries dropped.
std::vector<std::string> NoWeightDecayPatterns(const TrainerConfig& config);

// What one rank holds, in bytes: persistently (its params, grads and optimizer state, as the
// --dist mode keeps them) and at most at once in transient buffers (fsdp's gathered params and full
// grads; 0 in the other modes, which keep everything).
struct RankMemory {
  int64_t params_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t peak_transient_bytes = 0;
  int64_t max_rss_bytes = 0;  // the process's peak resident memory (all of it, LibTorch included)
  // The most CPU tensor memory LibTorch's allocator had handed out at once (the allocator's own
  // count: integration/metrics/allocator_stats.h; 0 where the counter is not installed).
  int64_t allocator_peak_bytes = 0;
  // MoE: the part of the three above that is experts' (0 for a dense model, and then not in the
  // JSON), and the Newton–Schulz cost this rank's Muon slots take per step (Muon::ns_cost).
  int64_t expert_params_bytes = 0;
  int64_t expert_grads_bytes = 0;
  int64_t expert_state_bytes = 0;
  int64_t ns_cost = 0;
  // The whole param buffers (what a rank of a non-sharded mode keeps of the params), and fsdp's
  // stated bound on peak_transient_bytes (ddp::DistributedDataParallel::TransientBoundOf; 0 in
  // the other modes).
  int64_t param_buffer_bytes = 0;
  int64_t transient_bound_bytes = 0;
  int64_t persistent_bytes() const { return params_bytes + grads_bytes + optimizer_state_bytes; }
  // peak_transient_bytes / param_buffer_bytes (0 without params): under 1, the gathered params
  // and full grads a sharded rank holds at once are less than one whole copy of the params.
  double peak_transient_over_param_buffer() const {
    return param_buffer_bytes > 0
               ? static_cast<double>(peak_transient_bytes) / static_cast<double>(param_buffer_bytes)
               : 0.0;
  }
};

// What a finished run reports (every rank gets the same numbers except the per-rank timings).
struct TrainSummary {
  int64_t steps = 0;
  double initial_loss = 0;        // training loss of step 1 (mean over ranks)
  double final_loss = 0;          // training loss of the last step (mean over ranks)
  double initial_eval_loss = 0;   // eval loss before training
  double eval_loss = 0;           // eval loss after the last step
  double unigram_entropy = 0;     // of the training tokens: what a context-free model reaches
  double tokens_per_s = 0;        // training tokens of all ranks / wall time of the steps
  double elapsed_s = 0;           // wall time of the steps (no eval)
  int world_size = 1;
  int tp = 1;                     // tensor-parallel size: world_size / tp data-parallel ranks
  std::string dist;
  std::string recompute;          // --recompute: none, full or selective
  int64_t recompute_layers = -1;  // --recompute_layers: the first N blocks; -1 every block
  std::string model;
  std::string optimizer;
  int64_t num_params = 0;
  int64_t skipped_steps = 0;      // non-finite gradients
  int64_t comm_bytes = 0;         // logical bytes this rank launched (every group of its mesh)
  // Per step, mean over the steps run (evals, checks and saves excluded), on this rank: logical
  // bytes launched, and seconds waited on param gathers and on grad syncs (what overlap did not
  // hide).
  int64_t comm_bytes_per_step = 0;
  int64_t wire_bytes_per_step = 0;  // what this rank sent (the engines' wire bytes), per step
  double param_gather_wait_s = 0;
  double grad_sync_wait_s = 0;
  // The steady steps (all but the first step run, which pays one-time costs; the only one if one
  // ran): median wall time per step, and rank 0's mean forward (including its param gather
  // waits), backward and optimizer seconds per step; CPU seconds (user + system, every thread)
  // per step summed over all ranks: robust to a shared machine's load, unlike wall time.
  double step_s = 0;
  double forward_s = 0;
  double backward_s = 0;
  double optimizer_s = 0;
  // Over the steady steps, the mean of StepCost's cross-rank figures (run_metrics.h, the same on
  // every rank): the least time any rank waited on communication per step (grad syncs and param
  // gathers on the step's critical path: what overlap left exposed) and the most minus the least
  // (skew between the ranks, waited out by the faster ones; no overlap can hide it).
  double exposed_comm_s = 0;
  double rank_skew_s = 0;
  double cpu_s_per_step = 0;
  int64_t param_buffer_bytes = 0;  // the model's params as laid out in buffers (padding included)
  int64_t checksum_checks = 0;    // cross-rank param checksum comparisons that passed
  int64_t failed_saves = 0;       // checkpoint saves that failed (on_save_failure=continue)
  int stop_signal = 0;            // stopped early on this signal (TrainOptions::stop_signal); 0 = no
  // Sum of all params at the end, computed exactly (common/exact_sum.h) and rounded once, so it
  // is the same on every rank and for bitwise-equal params at any rank count or layout.
  double param_checksum = 0;
  // The last step's --log_params_norm (the params entering it) and --log_num_zeros_in_grad; -1
  // when not asked for (left out of the JSON then).
  double params_norm = -1;
  int64_t num_zeros_in_grad = -1;
  // MoE (absent from the JSON for a dense model): the last step's auxiliary losses (unweighted,
  // summed over layers, mean over ranks and micro-batches), the all-to-all bytes per step this rank
  // launched (logical; TrafficCounters), and per layer the busiest and idlest expert's token
  // copies over every rank's step relative to the mean (1 = perfectly balanced).
  bool moe = false;
  double moe_aux_loss = 0;
  double moe_z_loss = 0;
  int64_t all_to_all_bytes_per_step = 0;
  int64_t all_to_all_wire_bytes_per_step = 0;  // of which sent to other ranks
  std::vector<double> expert_load_max, expert_load_min;
  // With --qk_clip_threshold (else clipped groups -1, both left out of the JSON): the largest
  // attention logit of the run (any step, block, head and rank, before clipping) and the KV groups
  // clipped, summed over the steps and blocks.
  double qk_clip_max_logit = 0;
  int64_t qk_clip_clipped_groups = -1;
  std::vector<RankMemory> memory;  // per rank, at the end of the run

  // One line of JSON, no newline: {"steps":300,"initial_loss":5.6,...,"memory":[...]}. A double
  // that is not finite (a diverged loss) is written as null, and a last member
  // "non_finite":["final_loss",...] names those keys; it is absent when every double is finite.
  std::string ToJson() const;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_CONFIG_TRAINER_CONFIG_H_
