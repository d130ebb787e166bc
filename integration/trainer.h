// The pretraining loop: model preset + dataset + per-rank loader + ChainedOptimizer (Muon for
// hidden matrices, AdamW for the rest) + lr schedule + periodic eval, with a progress line,
// TensorBoard scalars and a JSON-able summary. One call of Train runs on every rank of a
// Communicator.
//
// Routing (which params Muon updates) is decided once, published in the layout (ParamSpec::role),
// and read from there by the optimizer (optimizers::distributed::CreateDistributedOptimizer).
// Distribution modes (DistMode):
//   kReplicated  every rank holds and steps every param: DDP all-reduces the grad buckets during
//                backward (DdpConfig::grad_sync = kAllReduce), then every rank steps the same
//                ChainedOptimizer (DistributedMode::kReplicated: every param whole, each rank
//                saving its share) on the same grads, so params stay bit-identical (checked by a
//                cheap checksum every `check_every` steps and at the end); there is no param sync.
//   kLayerwise   ddp::DistributedDataParallel reduce-scatters grad buckets during backward
//                (overlapped) and all-gathers params through the model's pre-forward hook (each
//                layer waits for its own bucket group); the ChainedOptimizer (kSharded) steps Muon
//                on the whole matrices this rank owns in the shard-aligned layer-wise buffer and
//                ZeRO-1 AdamW on this rank's element range of the byte-level buffer. Each fused
//                weight's FusedSplit (QKV, SwiGLU fc1) is passed on, so Muon orthogonalises per
//                logical block exactly as kReplicated does; the two modes' params agree up to the
//                order the gradient reductions add.
//   kDistOpt     as kLayerwise with every param in the byte-level (ZeRO-1) layout; AdamW only
//                (Muon needs whole matrices, so --optimizer=muon is rejected).
//   kFsdp        as kLayerwise with sharded residency (ZeRO-3, ddp/'s DdpConfig::residency): each
//                rank keeps only its shard of every bucket of params and grads and the optimizer
//                state of what it owns; the model's layer hooks gather a layer's bucket groups
//                before its forward and its backward (prefetching the next layer's) and release
//                them after; nothing is gathered after the step. The same values in the same order
//                as kLayerwise: bitwise the same losses and params.
//
// TrainerConfig, its parsing and validation, and TrainSummary are in trainer_config.h (no
// LibTorch).
#ifndef ORTHOSHARD_INTEGRATION_TRAINER_H_
#define ORTHOSHARD_INTEGRATION_TRAINER_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "integration/config/train_options.h"
#include "integration/config/trainer_config.h"

namespace orthoshard::integration {

// Runs the whole training on this rank. Every rank of `comm` must call it with the same config.
// Rank 0 prints the routing report, the layout summary and progress to options.out and writes
// TensorBoard scalars to config.log_dir (created if missing): train/loss, train/lr,
// train/grad_norm, train/tokens_per_s, train/step_time_s, comm/bytes, eval/loss (and with
// config.qk_clip_threshold, qk_clip/max_logit and qk_clip/clipped_groups: integration/qk_clip.h).
//
// Checkpoints (config.save_dir, every mode): after every save_every-th step and after
// the last step run (stop_after or steps), each rank snapshots what it owns (params, sharded
// optimizer state) and writes it on a background thread (checkpoint::AsyncCheckpointSaver);
// rank 0 adds the shared state: step, the train loader's LoaderState, seed, and the configs
// "model=<preset> seq_len=<n>" and "optimizer=<muon|adamw>". The save is committed (`latest`
// moves; rank 0 prints "checkpoint of step N saved in DIR") at the first step at which every rank's
// write has ended, which the ranks learn from the step's loss all-reduce; at the latest, at the next
// save or after the last step. With config.resume, before anything
// is written, every rank loads save_dir's `latest` at this world size and layout (any saved dp),
// restores optimizer state, params (then the param all-gather), the step counter and the loader
// position, and runs steps saved+1 .. stop_after/steps. A checkpoint is INCOMPATIBLE, and Train
// fails before writing anything, when: save_dir has no `latest` or a shard is missing, truncated or
// fails its checksum (kNotFound / kDataLoss naming the file); the model preset or seq_len or the
// optimizer differ, or a param's shape or dtype does (kFailedPrecondition); the loader's seed,
// global batch, seq_len or dataset size differ (kFailedPrecondition "loader resume: ..."); or the
// saved step is not below the last step to run (kFailedPrecondition). Another rank's load
// failure is kFailedPrecondition too, so every rank exits with the bad-input code.
// A save that fails (a shard or the manifest cannot be written, the commit fails) never moves
// `latest`. Every rank learns of it (an all-reduce after each save phase) when the save in flight
// is finalized, as above. With config.on_save_failure "stop" Train
// returns its error naming the step, the save_dir and (on the rank that hit it) the file; a rank
// whose own part succeeded gets kAborted. With "continue", each rank writes "warning: checkpoint
// of step N in DIR failed: ...; training goes on" to options.err, counts it in
// TrainSummary::failed_saves, rank 0 removes the partial `.tmp` directory, and the next save is
// tried as usual; a failure of the final save, or config.max_consecutive_failed_saves failures in
// a row, still returns the error. A communicator failure during a save always stops the run.
// Non-finite gradients skip the step on every rank with all state untouched (counted in
// skipped_steps); after config.max_consecutive_skips consecutive skips the run stops: the last step
// is saved when save_dir is set (params and state are those of the last good step) and Train returns
// kAborted naming the step and the checkpoint.
// Graceful stop (options.stop_signal, e.g. SIGTERM from a scheduler about to preempt the job): the
// request rides on each step's loss all-reduce, so every rank ends after the same step, which is
// saved as the final checkpoint (no eval); the summary says stop_signal and `--resume` continues
// bitwise as after any checkpoint.
// Errors: as ValidateTrainerConfig, CheckSaveDir and LoadDatasetSpec; kInternal when the ranks' params diverge
// ("param checksum differs from rank 0's at step 20"), or for a LibTorch error; communicator
// errors as they come (kDeadlineExceeded, kUnavailable).
absl::StatusOr<TrainSummary> Train(const TrainerConfig& config, collectives::Communicator& comm,
                                   const TrainOptions& options = {});

// Checks, before anything is trained or written, that config.save_dir can take this run's
// checkpoints: it (or, while it does not exist yet, its nearest existing ancestor) is a directory
// this process can write in; and without config.resume it holds no checkpoint (a `latest` pointer
// or a complete step_NNNNNN directory): a run started afresh there would commit over that run's
// steps and garbage-collect its checkpoints. OK when save_dir is empty. Train calls it on every
// rank; pretrain also calls it before it launches any. Errors: kFailedPrecondition naming the path
// and what to do.
absl::Status CheckSaveDir(const TrainerConfig& config);

// Errors that Train returns once training has begun (after resume, from the first eval and step
// on: a lost rank, a failed save, a LibTorch error) carry this status payload: whatever their code
// (a save can fail with kNotFound), they are failures of the run, not of its input.
inline constexpr char kFailedWhileTrainingPayload[] = "type.orthoshard/failed_while_training";
bool FailedWhileTraining(const absl::Status& status);

// The exit code of a pretrain process whose run ended with `status`: 0 for OK; 2 for bad input
// found before training (kInvalidArgument, kNotFound, kFailedPrecondition, kDataLoss,
// kUnimplemented, without kFailedWhileTrainingPayload); 1 for any other failure.
int ExitCode(const absl::Status& status);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_TRAINER_H_
