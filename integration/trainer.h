// The pretraining loop: model preset + dataset + per-rank loader + ChainedOptimizer (Muon for hidden
// matrices, AdamW for the rest) + lr schedule + periodic eval, with a progress line, TensorBoard
// scalars and a JSON-able summary. One call of Train runs on every rank of a Communicator.
//
// Distribution modes (DistMode):
//   kReplicated  every rank holds and steps every param. Grads live in ParamAndGradBuffers (the
//                layer-wise layout of layout/); after backward each bucket is all-reduced (AVG) in
//                one grouped launch, then every rank steps the same ChainedOptimizer on the same
//                grads, so params stay bit-identical (checked by a cheap checksum every
//                `check_every` steps and at the end).
//   kLayerwise   ddp::DistributedDataParallel reduce-scatters grad buckets during backward
//                (overlapped) and all-gathers params through the model's pre-forward hook (each
//                layer waits for its own bucket group); optimizers::distributed's
//                DistributedChainedOptimizer (kSharded) steps Muon on the whole matrices this rank
//                owns in the shard-aligned layer-wise buffer and ZeRO-1 AdamW on this rank's element
//                range of the byte-level buffer. Each fused weight's FusedSplit (QKV, SwiGLU fc1)
//                is passed on, so Muon orthogonalises per logical block exactly as kReplicated
//                does; the two modes' params agree up to the order the gradient reductions add.
//   kDistOpt     as kLayerwise with every param in the byte-level (ZeRO-1) layout; AdamW only
//                (Muon needs whole matrices, so --optimizer=muon is rejected).
//
// Config comes from three places, later ones winning: TrainerConfig's defaults, a text-format
// `PretrainConfig` proto (pretrain_config.proto, ApplyConfigText), and command-line flags.
#ifndef ORTHOSHARD_INTEGRATION_TRAINER_H_
#define ORTHOSHARD_INTEGRATION_TRAINER_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collectives/communicator.h"

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
  std::string device = "cpu";        // cpu; cuda needs the NCCL communicator (kUnimplemented)
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
  uint64_t seed = 1234;              // model init, data permutation and synthetic corpus
  int num_threads = 1;               // at::set_num_threads per rank (ranks share the cores); 0 = leave
};

// Fills `config` from a text-format orthoshard.integration.PretrainConfig: only fields present in
// the text are changed. Errors: kInvalidArgument with the parser's message (line:column) for text
// that does not parse ("config 'x': 3:1: Message type ... has no field named \"stepz\"").
absl::Status ApplyConfigText(absl::string_view text, absl::string_view name, TrainerConfig* config);

// Checks values that need no files or ranks. Errors: kInvalidArgument naming the field and its
// bound (steps >= 1, known preset/optimizer/schedule, batch divisibility by world_size x
// micro_batches, seq_len <= the preset's max_seq_len, eval_fraction in (0, 1), distopt with
// muon, --resume or --save_every without --save_dir, --save_dir with --dist=replicated,
// stop_after > steps, ...); kUnimplemented for device cuda.
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
  double param_checksum = 0;      // sum of all params at the end (identical on every rank)

  // One line of JSON, no newline: {"steps":300,"initial_loss":5.6,...}.
  std::string ToJson() const;
};

struct TrainOptions {
  std::FILE* out = stdout;        // progress and start-up report (rank 0 only); not owned
  bool terminal = false;          // redraw the progress line in place (see ProgressPrinter)
};

// Runs the whole training on this rank. Every rank of `comm` must call it with the same config.
// Rank 0 prints the routing report, the layout summary and progress to options.out and writes
// TensorBoard scalars to config.log_dir (created if missing): train/loss, train/lr,
// train/grad_norm, train/tokens_per_s, train/step_time_s, comm/bytes, eval/loss.
//
// Checkpoints (config.save_dir, layerwise and distopt): after every save_every-th step and after
// the last step run (stop_after or steps), each rank snapshots what it owns (params, sharded
// optimizer state) and writes it on a background thread (checkpoint::AsyncCheckpointSaver);
// rank 0 adds the shared state: step, the train loader's LoaderState, seed, and the configs
// "model=<preset> seq_len=<n>" and "optimizer=<muon|adamw>". With config.resume, before anything
// is written, every rank loads save_dir's `latest` at this world size and layout (any saved dp),
// restores optimizer state, params (then the param all-gather), the step counter and the loader
// position, and runs steps saved+1 .. stop_after/steps. A checkpoint is INCOMPATIBLE, and Train
// fails before writing anything, when: save_dir has no `latest` or a shard is missing, truncated or
// fails its checksum (kNotFound / kDataLoss naming the file); the model preset or seq_len or the
// optimizer differ, or a param's shape or dtype does (kFailedPrecondition); the loader's seed,
// global batch, seq_len or dataset size differ (kFailedPrecondition "loader resume: ..."); or the
// saved step is not below the last step to run (kFailedPrecondition). Another rank's load
// failure is kFailedPrecondition too, so every rank exits with the bad-input code.
// Non-finite gradients skip the step on every rank with all state untouched (counted in
// skipped_steps); after config.max_consecutive_skips consecutive skips the run stops: the last step
// is saved when save_dir is set (params and state are those of the last good step) and Train returns
// kAborted naming the step and the checkpoint.
// Errors: as ValidateTrainerConfig and LoadDatasetSpec; kInternal when the ranks' params diverge
// ("param checksum differs from rank 0's at step 20"), or for a LibTorch error; communicator
// errors as they come (kDeadlineExceeded, kUnavailable).
absl::StatusOr<TrainSummary> Train(const TrainerConfig& config, collectives::Communicator& comm,
                                   const TrainOptions& options = {});

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_TRAINER_H_
