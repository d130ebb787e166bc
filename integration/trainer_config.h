// What a pretraining run is told and what it reports, as plain values with no LibTorch: the
// distribution mode, TrainerConfig (one comment per field), the text-format config parser, the checks
// that need no files or ranks, and TrainSummary. The run itself is Train in trainer.h.
//
// Config comes from three places, later ones winning: TrainerConfig's defaults, a text-format
// `PretrainConfig` proto (pretrain_config.proto, ApplyConfigText), and command-line flags.
#ifndef ORTHOSHARD_INTEGRATION_TRAINER_CONFIG_H_
#define ORTHOSHARD_INTEGRATION_TRAINER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::integration {

enum class DistMode { kReplicated, kLayerwise, kDistOpt };
const char* DistModeName(DistMode mode);  // "replicated", "layerwise", "distopt"
// Errors: kInvalidArgument naming the accepted values.
absl::StatusOr<DistMode> ParseDistMode(absl::string_view name);

struct TrainerConfig {
  std::string model = "tiny";        // GptPreset name: tiny, small, gpt2-124m
  std::string data = "synthetic";    // LoadDatasetSpec: synthetic[:N], text:P, nanogpt:P, megatron:P
  std::string optimizer = "muon";    // muon (Muon hidden matrices + AdamW rest) or adamw (all AdamW)
  std::string dist = "layerwise";    // layerwise (sharded Muon + ZeRO-1 AdamW), distopt, replicated
  std::string device = "cpu";        // cpu (Gloo) or cuda (NCCL; one GPU per rank, LOCAL_RANK)
  int64_t steps = 300;               // optimizer steps, >= 1
  int64_t global_batch = 32;         // samples per step over all ranks; divisible by ranks x micro
  int64_t micro_batches = 1;         // gradient-accumulation micro-batches per step on each rank
  int64_t seq_len = 0;               // tokens per sample; 0 = the preset's max_seq_len
  double lr = 3e-3;                  // AdamW base lr (and every param's with optimizer=adamw)
  double muon_lr = 0.02;             // Muon base lr
  double weight_decay = 0.01;        // AdamW decay of 2-D params (norms are not decayed)
  double muon_weight_decay = 0.01;   // Muon decay
  double max_grad_norm = 1.0;        // global-norm clip; <= 0 disables
  std::string schedule = "cosine";   // constant, cosine, linear, wsd
  int64_t warmup_steps = 20;         // linear warmup steps (capped at steps)
  double min_lr_ratio = 0.1;         // floor of the decay, in [0, 1]
  int64_t decay_steps = 0;           // wsd only: length of the final decay; 0 = steps / 5
  int64_t eval_every = 100;          // eval every this many steps (and always at the end); 0 = end only
  int64_t eval_batches = 4;          // eval micro-batches per rank per eval
  double eval_fraction = 0.05;       // tail of the dataset held out for eval, in (0, 1)
  int64_t bucket_elems = 1 << 16;    // soft minimum bucket size (elements) of the grad buffers
  int64_t check_every = 100;         // cross-rank param checksum every N steps (and at the end); 0 = end
  int64_t log_every = 10;            // non-terminal progress: a line every N steps
  std::string log_dir;               // TensorBoard event files (rank 0); empty = none
  std::string save_dir;              // checkpoint root (layerwise/distopt only); saved at the end
  int64_t save_every = 0;            // also save every N steps; 0 = at the end only
  bool resume = false;               // continue from save_dir's `latest` (see Train)
  int64_t stop_after = 0;            // stop after this step (the schedule still spans steps); 0 = steps
  int keep_checkpoints = 3;          // complete checkpoints kept in save_dir; 0 = all
  // Stop (kAborted, after a final checkpoint when save_dir is set) once this many consecutive steps
  // were skipped for non-finite gradients; 0 = never stop.
  int64_t max_consecutive_skips = 10;
  // A checkpoint save that fails (disk full, file-size limit, I/O error): "stop" ends the run with
  // its error; "continue" reports it on every rank, counts it in TrainSummary::failed_saves and
  // trains on, trying again at the next save (see Train).
  std::string on_save_failure = "stop";
  // With on_save_failure=continue: stop anyway once this many saves in a row failed; 0 = never.
  int64_t max_consecutive_failed_saves = 3;
  uint64_t seed = 1234;              // model init, data permutation and synthetic corpus
  int num_threads = 1;               // at::set_num_threads per rank (ranks share the cores); 0 = leave
  // Bound, in seconds, on every wait on another rank (each collective, and the rendezvous): a rank
  // that does not take part within it (dead, hung, stopped) fails the job on every rank, naming it.
  int64_t distributed_timeout_s = 60;
};

// Fills `config` from a text-format orthoshard.integration.PretrainConfig: only fields present in
// the text are changed. Errors: kInvalidArgument with the parser's message (line:column) for text
// that does not parse ("config 'x': 3:1: Message type ... has no field named \"stepz\"").
absl::Status ApplyConfigText(absl::string_view text, absl::string_view name, TrainerConfig* config);

// Checks values that need no files or ranks. Errors: kInvalidArgument naming the field and its
// bound (steps >= 1, known preset/optimizer/schedule, batch divisibility by world_size x
// micro_batches, seq_len <= the preset's max_seq_len, eval_fraction in (0, 1), max_grad_norm
// NaN, distopt with muon, --resume or --save_every without --save_dir, stop_after > steps, on_save_failure other than stop or continue, device
// other than cpu or cuda, ...). Whether this build and machine can run cuda is the caller's check.
absl::Status ValidateTrainerConfig(const TrainerConfig& config, int world_size);

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
  std::string dist;
  std::string model;
  std::string optimizer;
  int64_t num_params = 0;
  int64_t skipped_steps = 0;      // non-finite gradients
  int64_t comm_bytes = 0;         // logical bytes this rank launched (communicator counters)
  int64_t checksum_checks = 0;    // cross-rank param checksum comparisons that passed
  int64_t failed_saves = 0;       // checkpoint saves that failed (on_save_failure=continue)
  int stop_signal = 0;            // stopped early on this signal (TrainOptions::stop_signal); 0 = no
  double param_checksum = 0;      // sum of all params at the end (identical on every rank)

  // One line of JSON, no newline: {"steps":300,"initial_loss":5.6,...}.
  std::string ToJson() const;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_TRAINER_CONFIG_H_
