// Where a training run's measurements go: the TrainSummary (every rank), and on rank 0 the
// progress line and the TensorBoard scalars (train/loss, train/lr, train/grad_norm,
// train/tokens_per_s, train/step_time_s, comm/bytes, eval/loss, memory/rank<r>/...). One object the
// trainer's loop reports each step and each eval to.
#ifndef ORTHOSHARD_INTEGRATION_METRICS_RUN_METRICS_H_
#define ORTHOSHARD_INTEGRATION_METRICS_RUN_METRICS_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/mesh.h"
#include "integration/config/train_options.h"
#include "integration/config/trainer_config.h"
#include "integration/metrics/progress.h"
#include "integration/metrics/tensorboard.h"
#include "optimizers/chained.h"

namespace orthoshard::integration {

// What a rank launched so far over every distinct communicator of its mesh (roles that share one
// counted once): logical and wire bytes of every kind, and those of all-to-alls.
struct MeshTraffic {
  int64_t bytes = 0, wire_bytes = 0, all_to_all_bytes = 0, all_to_all_wire_bytes = 0;
};
MeshTraffic TrafficOf(const collectives::Mesh& mesh);

// What one step cost this rank: wall time, logical bytes it launched, the time it waited on
// param gathers and grad syncs (communication not hidden behind computation), and where the wall
// time went: forward (of every micro-batch, including the pre-forward hooks' param gather waits),
// backward (including launching the overlapped reduce-scatters), the optimizer step; and the
// process's CPU time (every thread: compute and the communication threads).
struct StepCost {
  absl::Duration time;
  int64_t comm_bytes = 0;
  int64_t wire_bytes = 0;
  double param_gather_wait_s = 0;
  double grad_sync_wait_s = 0;
  // Over every rank (StepAgreement): the least time any rank waited on communication in this
  // step, the communication on the step's critical path; and the most minus the least, the skew
  // between the ranks that the faster ones spent waiting for the slowest.
  double exposed_comm_s = 0;
  double rank_skew_s = 0;
  double forward_s = 0;
  double backward_s = 0;
  double optimizer_s = 0;
  double cpu_s = 0;
};

// A mixture-of-experts step over every rank (integration/experts.h): the auxiliary losses
// (unweighted, mean over layers, ranks and micro-batches; the load-balancing loss is 1 for a
// perfectly balanced router) and per layer the busiest and idlest expert's token copies relative
// to the mean; all_to_all_bytes: the logical bytes of the step's all-to-alls this rank launched
// (dispatch and combine, forward and backward, and the counts), all_to_all_wire_bytes what of them
// it sent to other ranks. moe false: a dense model (nothing reported).
struct ExpertStats {
  bool moe = false;
  double aux_loss = 0;
  double z_loss = 0;
  std::vector<double> load_max, load_min;
  int64_t all_to_all_bytes = 0;
  int64_t all_to_all_wire_bytes = 0;
};

// CPU seconds this process has used so far (user + system, all threads).
double ProcessCpuSeconds();
// The most resident memory this process has held so far (getrusage's ru_maxrss), in bytes.
int64_t MaxRssBytes();

class RunMetrics {
 public:
  // `summary` is filled as the run goes; the first step run is `first_step` (after a resume, the
  // step after the saved one); a step trains `tokens_per_step` tokens over all ranks.
  // `mesh` (this rank's groups over `comm`, the world) is where the traffic is counted.
  RunMetrics(const TrainerConfig& config, const collectives::Communicator& comm,
             const collectives::Mesh& mesh,
             const TrainOptions& options, TrainSummary& summary, int64_t first_step,
             double tokens_per_step);

  // Rank 0 opens an event file in `log_dir` (created if missing; nothing when empty); a resumed run
  // (first_step > 1) starts it with a restart record at first_step (EventWriter::AddSessionStart).
  // Errors: kFailedPrecondition for a log_dir that cannot be created; the writer's.
  absl::Status OpenTensorBoard(const std::string& log_dir);

  // The progress line, for whoever prints between its updates (the checkpointer).
  ProgressPrinter& progress() { return progress_; }

  // Step `step` cost `cost`, its loss (mean over ranks) was `loss` and the optimizer reported
  // `result`. Errors: the event writer's.
  // `experts`: an MoE model's step (progress line "aux", TensorBoard moe/..., the summary).
  absl::Status Step(int64_t step, double loss, const optimizers::StepResult& result,
                    const StepCost& cost, const ExpertStats& experts = {});

  // QK-clip's figures of step `step`, reported before its Step: the largest attention logit (over
  // every block, head and rank, before clipping) and the KV groups clipped, which a skipped step
  // does not apply. Shown on the progress line and as qk_clip/max_logit and
  // qk_clip/clipped_groups; the summary keeps the run's largest logit and clipped groups in all.
  // Errors: the event writer's.
  absl::Status QkClip(int64_t step, double max_logit, int64_t clipped_groups, bool skipped);

  // The eval loss before the first step run (TensorBoard: at step 0 in a fresh run, not logged in a
  // resumed one), and after step `step`. Errors: the event writer's.
  absl::Status InitialEval(double loss);
  absl::Status Eval(int64_t step, double loss);

  // The totals, once the steps are done, and (TensorBoard) each rank's memory from the summary's
  // `memory` (memory/rank<r>/params_bytes, grads_bytes, optimizer_state_bytes,
  // peak_transient_bytes, max_rss_bytes at the last step). Errors: the event writer's.
  absl::Status Finish(int64_t skipped_steps);
  // This rank's CPU seconds per steady step (see steady_times_), once Finish ran, for the caller to
  // sum over ranks into TrainSummary::cpu_s_per_step.
  double steady_cpu_s_per_step() const { return steady_cpu_s_per_step_; }

 private:
  int64_t StepsRun() const { return summary_.steps - first_step_ + 1; }
  absl::Status Scalar(absl::string_view tag, int64_t step, double value);
  absl::Status ExpertScalars(int64_t step, const ExpertStats& experts);

  const collectives::Communicator& comm_;
  const collectives::Mesh& mesh_;
  std::FILE* out_;
  TrainSummary& summary_;
  double lr_;
  double muon_lr_;  // 0 when no param is Muon's (--optimizer=adamw)
  bool params_norm_;
  bool zero_grads_;
  int64_t first_step_;
  double tokens_per_step_;
  ProgressPrinter progress_;
  ProgressSample qk_clip_;  // the figures QkClip reported for the coming Step (its two fields)
  std::unique_ptr<EventWriter> tb_;
  absl::Duration train_time_;
  StepCost totals_;  // summed over the steps run
  // The steady steps (every step run but the first, which pays one-time costs: allocation, first
  // touches, lazy initialisation; all of them when only one step ran): wall times, and sums.
  std::vector<double> steady_times_;
  StepCost steady_totals_;
  StepCost first_cost_;
  double steady_cpu_s_per_step_ = 0;  // set by Finish
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_METRICS_RUN_METRICS_H_
