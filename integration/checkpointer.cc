// See checkpointer.h.
#include "integration/checkpointer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "common/status_macros.h"
#include "integration/trainer.h"

namespace orthoshard::integration {

using collectives::AllRanksOk;

checkpoint::TensorParallelism CheckpointTensorParallelism(const Setup& s) {
  checkpoint::TensorParallelism tp;
  tp.dp_comm = &s.mesh->dp();
  tp.size = s.mesh->tp().size();
  tp.rank = s.mesh->tp().rank();
  for (const model::ModelParam& p : s.model->params()) {
    if (p.tp.split()) tp.splits[p.name] = p.tp;
  }
  return tp;
}

absl::Status CheckSaveDir(const TrainerConfig& c) {
  namespace fs = std::filesystem;
  if (c.save_dir.empty()) return absl::OkStatus();
  const std::string flag = absl::StrCat("--save_dir '", c.save_dir, "'");
  std::error_code ec;
  const fs::path target = fs::absolute(c.save_dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat(flag, ": ", ec.message()));
  // The nearest of target and its ancestors that exists (ENOTDIR reads as not found, so a path
  // through a regular file stops at that file).
  fs::path existing = target;
  fs::file_status status = fs::status(existing, ec);
  while (status.type() == fs::file_type::not_found && existing.has_relative_path()) {
    existing = existing.parent_path();
    status = fs::status(existing, ec);
  }
  if (status.type() == fs::file_type::none) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": cannot examine '", existing.string(), "': ", ec.message()));
  }
  if (status.type() != fs::file_type::directory) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": '", existing.string(), "' is not a directory"));
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, ": cannot write in '", existing.string(), "': ", std::strerror(errno)));
  }
  if (existing != target || Resuming(c)) return absl::OkStatus();
  absl::StatusOr<std::vector<int64_t>> steps = checkpoint::ListCheckpoints(c.save_dir);
  absl::StatusOr<bool> has_latest =
      checkpoint::PathExists(checkpoint::JoinPath(c.save_dir, "latest"));
  for (const absl::Status& s : {steps.status(), has_latest.status()}) {
    if (!s.ok()) return absl::FailedPreconditionError(absl::StrCat(flag, ": ", s.message()));
  }
  if (steps->empty() && !*has_latest) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      flag, " already holds checkpoints (",
      steps->empty() ? "a `latest` pointer"
                     : absl::StrCat(steps->size(), " complete, the newest ",
                                    checkpoint::StepDirName(steps->back())),
      "): pass --resume to continue from them, or choose another --save_dir; a run started afresh "
      "there would overwrite and garbage-collect them"));
}

Checkpointer::Checkpointer(const TrainerConfig& c, collectives::Communicator& comm,
                           ProgressPrinter& progress, const TrainOptions& options,
                           TrainSummary& summary, std::vector<buffers::ParamAndGradBuffer*> buffers,
                           const optimizers::OptimizerState& optimizer,
                           std::function<absl::Status()> sync_params,
                           collectives::Communicator* expert_comm,
                           checkpoint::TensorParallelism tp)
    : c_(c),
      comm_(comm),
      expert_comm_(expert_comm),
      tp_(std::move(tp)),
      progress_(progress),
      out_(options.out),
      err_(options.err),
      summary_(summary),
      buffers_(std::move(buffers)),
      optimizer_(optimizer),
      sync_params_(std::move(sync_params)) {
  options_.keep_last = c.keep_checkpoints;
  options_.after_shard_written = options.after_shard_written;
  saver_ = std::make_unique<checkpoint::AsyncCheckpointSaver>(&comm, expert_comm, tp_);
}

absl::Status Checkpointer::Save(const checkpoint::SharedState& shared, bool final_save) {
  RETURN_IF_ERROR(sync_params_());
  RETURN_IF_ERROR(FinalizeInFlight(/*final_save=*/false));
  const absl::Status started = saver_->Start(c_.save_dir, shared, buffers_, optimizer_, options_);
  ASSIGN_OR_RETURN(const bool ok, Settle(shared.step, started, final_save));
  if (ok) in_flight_step_ = shared.step;
  return absl::OkStatus();
}

absl::Status Checkpointer::CommitIfWrittenEverywhere(bool written_everywhere) {
  if (!in_flight() || !written_everywhere) return absl::OkStatus();
  RETURN_IF_ERROR(sync_params_());
  return FinalizeInFlight(/*final_save=*/false);
}

absl::Status Checkpointer::Finish() { return FinalizeInFlight(/*final_save=*/true); }

absl::Status Checkpointer::FinalizeInFlight(bool final_save) {
  if (in_flight_step_ == 0) return absl::OkStatus();
  const int64_t step = in_flight_step_;
  in_flight_step_ = 0;
  const absl::Status finalized = saver_->Finalize();
  ASSIGN_OR_RETURN(const bool committed, Settle(step, finalized, final_save));
  if (!committed) return absl::OkStatus();
  consecutive_failures_ = 0;
  if (comm_.rank() == 0) {
    progress_.Finish();
    std::fprintf(out_, "checkpoint of step %lld saved in %s\n", static_cast<long long>(step),
                 c_.save_dir.c_str());
    std::fflush(out_);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Checkpointer::Settle(int64_t step, const absl::Status& own, bool final_save) {
  ASSIGN_OR_RETURN(const bool all_ok, AllRanksOk(comm_, own.ok()));
  if (all_ok) return true;
  const absl::Status failure =
      own.ok() ? absl::AbortedError("another rank's part of the save failed") : own;
  const std::string what = absl::StrCat(final_save ? "final checkpoint" : "checkpoint",
                                        " of step ", step, " in ", c_.save_dir,
                                        " failed: ", failure.message());
  if (c_.on_save_failure != SaveFailurePolicy::kContinue) {
    return absl::Status(failure.code(), what);
  }
  ++summary_.failed_saves;
  ++consecutive_failures_;
  // Drop this rank's write still in flight (a snapshot failed elsewhere) without committing it;
  // once every rank has, rank 0 removes the partial `.tmp` directory so it holds no disk space.
  saver_ = std::make_unique<checkpoint::AsyncCheckpointSaver>(&comm_, expert_comm_, tp_);
  RETURN_IF_ERROR(AllRanksOk(comm_, true).status());
  std::string cleanup;
  if (comm_.rank() == 0) {
    if (absl::Status gc = checkpoint::GarbageCollect(c_.save_dir, c_.keep_checkpoints); !gc.ok()) {
      cleanup = absl::StrCat(" (removing its partial directory failed too: ", gc.message(), ")");
    }
  }
  if (final_save) {
    return absl::Status(failure.code(),
                        absl::StrCat(what, cleanup, " (--on_save_failure=continue; failed saves "
                                     "in this run: ", summary_.failed_saves, ")"));
  }
  if (c_.max_consecutive_failed_saves > 0 &&
      consecutive_failures_ >= c_.max_consecutive_failed_saves) {
    return absl::Status(failure.code(),
                        absl::StrCat(what, cleanup, "; ", consecutive_failures_,
                                     " saves in a row failed (--max_consecutive_failed_saves=",
                                     c_.max_consecutive_failed_saves, "), stopping"));
  }
  if (comm_.rank() == 0) progress_.Finish();
  std::fprintf(err_, "warning: %s%s; training goes on (--on_save_failure=continue; failed saves "
                     "so far: %lld)\n",
               what.c_str(), cleanup.c_str(), static_cast<long long>(summary_.failed_saves));
  std::fflush(err_);
  return false;
}

}  // namespace orthoshard::integration
