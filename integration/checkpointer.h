// The trainer's checkpoint saves (internal to //integration:trainer).
#ifndef ORTHOSHARD_INTEGRATION_CHECKPOINTER_H_
#define ORTHOSHARD_INTEGRATION_CHECKPOINTER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "buffers/param_and_grad_buffer.h"
#include "checkpoint/distributed_checkpoint.h"
#include "collectives/communicator.h"
#include "integration/config/train_options.h"
#include "integration/config/trainer_config.h"
#include "integration/metrics/progress.h"
#include "integration/setup.h"
#include "optimizers/state.h"

namespace orthoshard::integration {

// What checkpoint saves and loads need to know of this run's tensor parallelism: the dp group
// (s.mesh->dp()), this rank's place in its tp group (s.mesh->tp()) and every split param's
// ModelParam::tp. `s` must outlive the result's use.
checkpoint::TensorParallelism CheckpointTensorParallelism(const Setup& s);

// The checkpoint saves of one run (config.save_dir) and what a failed one does
// (config.on_save_failure). At most one save is in flight: AsyncCheckpointSaver writes it in the
// background, and it is finalized (barrier, commit; its failure detected) by CommitInFlight as soon
// as every rank's write is done, which the trainer learns from the all-reduce it runs every step,
// or else at the next save or at Finish. Every method but in_flight_written is collective: all
// ranks call it at the same step.
//
// Every save phase ends with an all-reduce of "did it fail here", so all ranks take the same
// branch even where the failure was local (AsyncCheckpointSaver::Start's snapshot); the library's
// own barriers already agree on write and commit failures. A failure of that all-reduce (the
// communicator) always stops the run.
class Checkpointer {
 public:
  // Saves `buffers` and `optimizer`; `sync_params` completes the param sync (a save snapshots, and
  // a commit runs collectives, only after the step's param all-gathers). `expert_comm` is the group
  // the expert buffers are sharded over (the mesh's expt_dp; checkpoint::SnapshotRank), null for
  // `comm`. `c`, `comm`, `expert_comm`, `progress`,
  // `options.out`, `options.err`, `summary`, the buffers and the optimizer must outlive this
  // object. Rank 0 reports each committed checkpoint on options.out; failed saves that training
  // survives are reported on options.err and counted in summary.failed_saves;
  // options.after_shard_written is passed to every save (checkpoint::SaveOptions). `tp`: the run's
  // tensor parallelism (CheckpointTensorParallelism), passed to every save.
  Checkpointer(const TrainerConfig& c, collectives::Communicator& comm, ProgressPrinter& progress,
               const TrainOptions& options, TrainSummary& summary,
               std::vector<buffers::ParamAndGradBuffer*> buffers,
               const optimizers::OptimizerState& optimizer,
               std::function<absl::Status()> sync_params,
               collectives::Communicator* expert_comm = nullptr,
               checkpoint::TensorParallelism tp = {});

  // Finalizes the save in flight, syncs the params, then snapshots step `shared.step` and starts
  // writing it. OK when training may go on (with on_save_failure=continue, also after a failed
  // save, reported on err). Errors: the save's, naming the step (a rank whose own part succeeded
  // gets kAborted); the communicator's.
  absl::Status Save(const checkpoint::SharedState& shared, bool final_save);

  // Finalizes the save in flight, the run's last. Errors: as Save, also with continue.
  absl::Status Finish();

  // Whether a save is in flight and this rank's part of it is written (never blocks; local).
  bool in_flight() const { return in_flight_step_ != 0; }
  bool in_flight_written() const { return in_flight() && saver_->write_finished(); }

  // Commits the save in flight (barrier, rank 0 merges and commits, `latest` moves) when
  // `written_everywhere`: every rank's in_flight_written() held, as the ranks agreed at this step,
  // so nobody waits on a write. Nothing otherwise. Errors: as Save.
  absl::Status CommitIfWrittenEverywhere(bool written_everywhere);

 private:
  absl::Status FinalizeInFlight(bool final_save);

  // Agrees on the outcome `own` of one phase of the save of `step`. Returns whether it succeeded on
  // every rank; false after a failure that training survives (reported on err_). Errors: the
  // failure when the run must stop; the communicator's.
  absl::StatusOr<bool> Settle(int64_t step, const absl::Status& own, bool final_save);

  const TrainerConfig& c_;
  collectives::Communicator& comm_;
  collectives::Communicator* expert_comm_;
  checkpoint::TensorParallelism tp_;
  ProgressPrinter& progress_;
  std::FILE* out_;
  std::FILE* err_;
  TrainSummary& summary_;
  checkpoint::SaveOptions options_;
  std::vector<buffers::ParamAndGradBuffer*> buffers_;
  const optimizers::OptimizerState& optimizer_;
  std::function<absl::Status()> sync_params_;
  std::unique_ptr<checkpoint::AsyncCheckpointSaver> saver_;
  int64_t in_flight_step_ = 0;  // step of the save being written; 0 = none
  int64_t consecutive_failures_ = 0;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_CHECKPOINTER_H_
