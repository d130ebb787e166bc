// The run of trainer.h over what Build (setup.h) made: resume, the training loop, and the end of
// the run, with distributed checkpoints (checkpoint/distributed_checkpoint.h) for save and resume.
// One step is step.h's (in the order of a StepSchedule), the checks run_checks.h's, what the run
// prints run_report.h's.
#include "integration/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/commit.h"
#include "checkpoint/distributed_checkpoint.h"
#include "common/dtype.h"
#include "common/heap.h"
#include "common/status_macros.h"
#include "data/loader.h"
#include "ddp/distributed_data_parallel.h"
#include "integration/checkpointer.h"
#include "integration/experts.h"
#include "integration/metrics/progress.h"
#include "integration/metrics/run_metrics.h"
#include "integration/metrics/step_profiler.h"
#include "integration/qk_clip.h"
#include "integration/rank_values.h"
#include "integration/run_checks.h"
#include "integration/run_policy.h"
#include "integration/run_report.h"
#include "integration/setup.h"
#include "integration/step.h"
#include "integration/step_agreement.h"
#include "integration/step_schedule.h"
#include "layout/layout.h"
#include "model/gpt_config.h"
#include "model/model.h"
#include "optimizers/chained.h"

namespace orthoshard::integration {
namespace {

using collectives::Communicator;
using data::LoaderState;


// Loads save_dir's `latest` into the buffers, the sharded optimizer and the train loader; returns
// the step it was saved at. Nothing is written. Errors: see Train in trainer.h.
absl::StatusOr<int64_t> Resume(const TrainerConfig& c, Setup& s, Communicator& comm,
                               int64_t last_step, std::FILE* out) {
  at::NoGradGuard no_grad;
  absl::StatusOr<checkpoint::SharedState> loaded =
      checkpoint::LoadDistributedCheckpoint(c.save_dir, s.buffers, *s.optimizer, comm,
                                            &s.mesh->expt_dp(), CheckpointTensorParallelism(s));
  if (!loaded.ok()) {
    const absl::Status& e = loaded.status();
    // kAborted is "another rank failed to load": still the checkpoint's fault, i.e. bad input.
    return absl::Status(e.code() == absl::StatusCode::kAborted
                            ? absl::StatusCode::kFailedPrecondition
                            : e.code(),
                        absl::StrCat("--resume from '", c.save_dir, "': ", e.message()));
  }
  // Nothing below can fail on one rank only: every rank got the same shared state.
  const std::string prefix = absl::StrCat("--resume from '", c.save_dir, "' (step ", loaded->step, "): ");
  if (loaded->model_config != ModelConfigString(c, s)) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, "saved by '", loaded->model_config,
                                                      "', this run is '", ModelConfigString(c, s), "'"));
  }
  if (loaded->optimizer_config != OptimizerConfigString(c)) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, "saved by '", loaded->optimizer_config,
                                                      "', this run is '", OptimizerConfigString(c), "'"));
  }
  if (comm.rank() == 0) {
    // Complete checkpoints newer than the one resumed from belong to an abandoned timeline (a crash
    // before `latest` moved, or `latest` moved back by hand); saves of those steps replace them.
    absl::StatusOr<std::vector<int64_t>> newer = checkpoint::CheckpointsNewerThanLatest(c.save_dir);
    if (newer.ok() && !newer->empty()) {
      std::vector<std::string> names;
      for (int64_t step : *newer) names.push_back(checkpoint::StepDirName(step));
      std::fprintf(out, "pretrain: warning: %s holds %s, newer than `latest` (%s): "
                   "ignored, and replaced when training saves those steps again\n",
                   c.save_dir.c_str(), absl::StrJoin(names, ", ").c_str(),
                   checkpoint::StepDirName(loaded->step).c_str());
      std::fflush(out);
    }
  }
  if (loaded->step >= last_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "nothing left to run: the last step of this run is ", last_step));
  }
  absl::StatusOr<LoaderState> position = LoaderState::Parse(loaded->data_position);
  if (!position.ok()) {
    return absl::DataLossError(absl::StrCat(prefix, "data position: ", position.status().message()));
  }
  if (absl::Status r = s.train->Restore(*position); !r.ok()) {
    return absl::Status(r.code(), absl::StrCat(prefix, r.message()));
  }
  return loaded->step;
}

absl::Status MarkFailedWhileTraining(absl::Status status) {
  status.SetPayload(kFailedWhileTrainingPayload, absl::Cord());
  return status;
}

// One run per --save_dir: rank 0, which commits, takes the root's lock for the whole run. Every
// rank learns the outcome, so none waits on a rank 0 that gave up. Returns rank 0's lock.
absl::StatusOr<std::optional<checkpoint::RootLock>> LockSaveDir(const TrainerConfig& c,
                                                                Communicator& comm) {
  std::optional<checkpoint::RootLock> root_lock;
  if (c.save_dir.empty()) return root_lock;
  absl::Status locked = absl::OkStatus();
  if (comm.rank() == 0) {
    absl::StatusOr<checkpoint::RootLock> lock =
        checkpoint::LockRoot(c.save_dir, absl::StrCat("pretrain rank 0 of ", comm.size()));
    if (lock.ok()) {
      root_lock.emplace(*std::move(lock));
    } else {
      locked = absl::FailedPreconditionError(absl::StrCat("--save_dir: ", lock.status().message()));
    }
  }
  ASSIGN_OR_RETURN(const bool all_ok, collectives::AllRanksOk(comm, locked.ok()));
  if (!locked.ok()) return locked;
  if (!all_ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save_dir '", c.save_dir, "': rank 0 could not lock it (see rank 0's error)"));
  }
  return root_lock;
}

// The shared state a checkpoint of `step` records.
checkpoint::SharedState SharedStateAt(const TrainerConfig& c, const Setup& s, int64_t step) {
  checkpoint::SharedState shared;
  shared.step = step;
  shared.data_position = s.train->state().Serialize();
  shared.rng_seed = c.seed;
  shared.model_config = ModelConfigString(c, s);
  shared.optimizer_config = OptimizerConfigString(c);
  return shared;
}

// The stop signal the process has received (0: none).
int StopSignal(const TrainOptions& options) {
  return options.stop_signal != nullptr ? options.stop_signal->load(std::memory_order_relaxed) : 0;
}

// The training loop, from the initial eval to the last step's plan: every decision is made
// elsewhere (RunStep and the ranks' agreement, RunPolicy, RunMetrics, the Checkpointer) and only
// carried out here.
absl::Status TrainLoop(const TrainerConfig& c, Communicator& comm, const TrainOptions& options,
                       Setup& s, RunMetrics& metrics, TrainSummary& summary, int64_t first_step) {
  ASSIGN_OR_RETURN(const double initial_eval, Evaluate(s, comm));
  RETURN_IF_ERROR(metrics.InitialEval(initial_eval));
  std::unique_ptr<Checkpointer> saver;
  if (!c.save_dir.empty()) {
    saver = std::make_unique<Checkpointer>(c, comm, metrics.progress(), options, summary,
                                           s.buffers, *s.optimizer,
                                           [&s] { return s.ddp->FinishParamSync(); },
                                           &s.mesh->expt_dp(), CheckpointTensorParallelism(s));
  }
  RunPolicy policy(c, first_step);
  StepAgreement agreement(comm);
  std::unique_ptr<QkClip> qk_clip;
  if (c.qk_clip_threshold > 0) {
    qk_clip = std::make_unique<QkClip>(c.qk_clip_threshold, s.model.get());
  }
  ASSIGN_OR_RETURN(
      const std::unique_ptr<StepProfiler> profiler,
      StepProfiler::Create(c.profile_dir.empty() ? c.log_dir : c.profile_dir,
                           c.profile_step_start,
                           c.profile_step_end > 0 ? c.profile_step_end : c.profile_step_start,
                           comm.rank(), comm.device().is_cuda()));
  StepPlan plan;
  ExpertStep experts(c, *s.model);
  const SequentialSchedule schedule;  // no pipeline stages
  for (int64_t step = first_step; step <= policy.last_step() && !plan.last; ++step) {
    profiler->BeforeStep(step);
    ASSIGN_OR_RETURN(const StepOutcome outcome,
                     RunStep(s, comm, agreement, experts, schedule, StopSignal(options),
                             saver && saver->in_flight_written(), qk_clip.get()));
    plan = policy.After(step, outcome.result.skipped, outcome.agreed.stop_signal);
    if (profiler->StopsAfter(step, plan.last)) RETURN_IF_ERROR(s.ddp->FinishParamSync());
    RETURN_IF_ERROR(profiler->AfterStep(step, plan.last));
    if (plan.stop_early) summary.stop_signal = outcome.agreed.stop_signal;
    // The background save commits as soon as every rank has written its part: `latest` moves (and
    // a failure shows) within a step of the slowest write, not at the next save.
    if (saver) {
      RETURN_IF_ERROR(saver->CommitIfWrittenEverywhere(outcome.agreed.save_written_everywhere));
    }
    if (qk_clip) {
      RETURN_IF_ERROR(metrics.QkClip(step, outcome.qk_clip.max_logit,
                                     outcome.qk_clip.clipped_groups, outcome.result.skipped));
    }
    RETURN_IF_ERROR(
        metrics.Step(step, outcome.agreed.loss, outcome.result, outcome.cost, outcome.experts));
    if (plan.eval) {
      ASSIGN_OR_RETURN(const double eval, Evaluate(s, comm));
      RETURN_IF_ERROR(metrics.Eval(step, eval));
    }
    if (plan.check) {
      bool compared = false;
      ASSIGN_OR_RETURN(summary.param_checksum, ParamChecksum(s, step, &compared));
      summary.checksum_checks += compared;
    }
    // Snapshot now, written in the background while the next steps run.
    if (plan.save) RETURN_IF_ERROR(saver->Save(SharedStateAt(c, s, step), plan.last));
  }
  if (saver) RETURN_IF_ERROR(saver->Finish());
  RETURN_IF_ERROR(s.ddp->FinishParamSync());
  ASSIGN_OR_RETURN(summary.memory, GatherRankMemory(s, comm));
  RETURN_IF_ERROR(metrics.Finish(s.optimizer->skipped_steps()));
  ASSIGN_OR_RETURN(summary.cpu_s_per_step, SumOverRanks(comm, metrics.steady_cpu_s_per_step()));
  return ReportEnd(c, comm, options, summary, plan, policy.consecutive_skips());
}

absl::StatusOr<TrainSummary> TrainImpl(const TrainerConfig& c, Communicator& comm,
                                       const TrainOptions& options) {
  RETURN_IF_ERROR(ValidateTrainerConfig(c, comm.size()));
  RETURN_IF_ERROR(CheckSaveDir(c));
  // Model, buffers and batches live on the communicator's device; the config must agree with it.
  if (const bool cuda = c.device == Device::kCuda; cuda != comm.device().is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", ChoiceName(c.device), ": the ", comm.backend_name(),
                     " communicator reduces on ", comm.device().str(), ", expected ",
                     cuda ? "a CUDA device (NCCL)" : "the CPU (Gloo)"));
  }
  if (c.num_threads > 0) at::set_num_threads(c.num_threads);
  if (c.retain_freed_memory) RETURN_IF_ERROR(RetainFreedHeapMemory());
  ASSIGN_OR_RETURN(const std::optional<checkpoint::RootLock> root_lock, LockSaveDir(c, comm));
  ASSIGN_OR_RETURN(Setup s, Build(c, comm));
  int64_t first_step = 1;
  if (Resuming(c)) {
    ASSIGN_OR_RETURN(const int64_t saved_step, Resume(c, s, comm, LastStep(c), options.out));
    first_step = saved_step + 1;
  }
  TrainSummary summary;
  summary.world_size = comm.size();
  summary.tp = s.mesh->grid().tp;
  summary.dist = ChoiceName(c.dist);
  summary.recompute = ChoiceName(c.recompute);
  summary.recompute_layers = c.recompute_layers;
  summary.model = c.model;
  summary.optimizer = ChoiceName(c.optimizer);
  summary.num_params = model::GptParamCount(s.model->config());  // every expert, at any ep
  for (const layout::PerBufferParamLayout& b : s.layout.buffers) {
    summary.param_buffer_bytes += b.numel() * DTypeSize(b.key.param_dtype);
  }
  summary.unigram_entropy = s.unigram_entropy;
  if (comm.rank() == 0) {
    PrintRunHeader(c, s, comm, options.out);
    if (first_step > 1) {
      std::fprintf(options.out, "pretrain: resumed from the checkpoint of step %lld in %s\n",
                   static_cast<long long>(first_step - 1), c.save_dir.c_str());
    } else if (!c.save_dir.empty()) {
      std::fprintf(options.out, "pretrain: starting afresh (checkpoints in %s)\n",
                   c.save_dir.c_str());
    }
    std::fflush(options.out);
  }
  RunMetrics metrics(c, comm, *s.mesh, options, summary, first_step,
                     static_cast<double>(c.global_batch) * s.seq_len);
  RETURN_IF_ERROR(metrics.OpenTensorBoard(c.log_dir));
  // From here on a failure is the run's, not its input's.
  absl::Status trained = TrainLoop(c, comm, options, s, metrics, summary, first_step);
  if (!trained.ok()) return MarkFailedWhileTraining(std::move(trained));
  return summary;
}

}  // namespace

absl::StatusOr<TrainSummary> Train(const TrainerConfig& config, Communicator& comm,
                                   const TrainOptions& options) {
  try {
    return TrainImpl(config, comm, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("training: LibTorch error: ", e.what_without_backtrace()));
  }
}

bool FailedWhileTraining(const absl::Status& status) {
  return status.GetPayload(kFailedWhileTrainingPayload).has_value();
}

int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  if (FailedWhileTraining(status)) return 1;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnimplemented:
      return 2;
    default:
      return 1;
  }
}

}  // namespace orthoshard::integration
