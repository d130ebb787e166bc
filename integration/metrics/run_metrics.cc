#include "integration/metrics/run_metrics.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace orthoshard::integration {
namespace {

double NowSeconds() { return absl::ToUnixMicros(absl::Now()) / 1e6; }

// A traffic counter summed over every kind of collective.
int64_t SumOverKinds(const std::array<int64_t, collectives::kNumOpKinds>& per_kind) {
  return std::accumulate(per_kind.begin(), per_kind.end(), int64_t{0});
}

}  // namespace

double ProcessCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int64_t MaxRssBytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

MeshTraffic TrafficOf(const collectives::Mesh& mesh) {
  MeshTraffic out;
  std::vector<const collectives::Communicator*> seen;
  for (collectives::MeshRole role : collectives::kMeshRoles) {
    const collectives::Communicator* group = &mesh.group(role);
    if (std::find(seen.begin(), seen.end(), group) != seen.end()) continue;
    seen.push_back(group);
    const collectives::TrafficCounters traffic = group->traffic();
    out.bytes += SumOverKinds(traffic.bytes);
    out.wire_bytes += SumOverKinds(traffic.wire_bytes);
    out.all_to_all_bytes += traffic.Bytes(collectives::OpKind::kAllToAll);
    out.all_to_all_wire_bytes += traffic.WireBytes(collectives::OpKind::kAllToAll);
  }
  return out;
}

RunMetrics::RunMetrics(const TrainerConfig& config, const collectives::Communicator& comm,
                       const collectives::Mesh& mesh, const TrainOptions& options, TrainSummary& summary, int64_t first_step,
                       double tokens_per_step)
    : comm_(comm),
      mesh_(mesh),
      out_(options.out),
      summary_(summary),
      lr_(config.lr),
      muon_lr_(config.optimizer == OptimizerChoice::kMuon ? config.muon_lr : 0.0),
      params_norm_(config.log_params_norm),
      zero_grads_(config.log_num_zeros_in_grad),
      first_step_(first_step),
      tokens_per_step_(tokens_per_step),
      progress_(options.out, ProgressOptions{config.steps, config.log_every, options.terminal}) {}

absl::Status RunMetrics::OpenTensorBoard(const std::string& log_dir) {
  if (comm_.rank() != 0 || log_dir.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--log_dir '", log_dir, "': cannot create: ", ec.message()));
  }
  ASSIGN_OR_RETURN(tb_, EventWriter::Create(log_dir, NowSeconds()));
  // Resumed: TensorBoard drops what earlier files logged from this step on (a crashed run's steps
  // after its last checkpoint), which this run logs again.
  if (first_step_ > 1) RETURN_IF_ERROR(tb_->AddSessionStart(first_step_, NowSeconds()));
  return tb_->Flush();
}

absl::Status RunMetrics::Step(int64_t step, double loss, const optimizers::StepResult& result,
                              const StepCost& cost, const ExpertStats& experts) {
  const absl::Duration time = cost.time;
  train_time_ += time;
  totals_.comm_bytes += cost.comm_bytes;
  totals_.wire_bytes += cost.wire_bytes;
  totals_.param_gather_wait_s += cost.param_gather_wait_s;
  totals_.grad_sync_wait_s += cost.grad_sync_wait_s;
  if (step == first_step_) {
    summary_.initial_loss = loss;
    first_cost_ = cost;
  } else {
    steady_times_.push_back(absl::ToDoubleSeconds(time));
    steady_totals_.forward_s += cost.forward_s;
    steady_totals_.backward_s += cost.backward_s;
    steady_totals_.optimizer_s += cost.optimizer_s;
    steady_totals_.exposed_comm_s += cost.exposed_comm_s;
    steady_totals_.rank_skew_s += cost.rank_skew_s;
    steady_totals_.cpu_s += cost.cpu_s;
  }
  summary_.final_loss = loss;
  summary_.steps = step;
  const double params_norm = params_norm_ ? std::sqrt(result.stats.param_sum_squares) : -1.0;
  const double zero_grads = zero_grads_ ? result.stats.zero_grads : -1.0;
  summary_.params_norm = params_norm;
  summary_.num_zeros_in_grad = static_cast<int64_t>(zero_grads);
  if (experts.moe) {
    summary_.moe = true;
    summary_.moe_aux_loss = experts.aux_loss;
    summary_.moe_z_loss = experts.z_loss;
    summary_.expert_load_max = experts.load_max;
    summary_.expert_load_min = experts.load_min;
    summary_.all_to_all_bytes_per_step = experts.all_to_all_bytes;
    summary_.all_to_all_wire_bytes_per_step = experts.all_to_all_wire_bytes;
  }
  if (comm_.rank() != 0) return absl::OkStatus();
  const double elapsed = absl::ToDoubleSeconds(train_time_);
  const double tokens_per_s = elapsed > 0 ? tokens_per_step_ * StepsRun() / elapsed : 0;
  const double lr = lr_ * result.lr_multiplier;
  const double muon_lr = muon_lr_ * result.lr_multiplier;
  ProgressSample sample{step, loss, tokens_per_s, lr, elapsed};
  sample.muon_lr = muon_lr_ > 0 ? muon_lr : -1.0;
  sample.grad_norm = result.grad_norm;
  sample.params_norm = params_norm;
  sample.zero_grads = zero_grads;
  if (experts.moe) {
    sample.moe_aux_loss = experts.aux_loss;
    sample.expert_load_max = *std::max_element(experts.load_max.begin(), experts.load_max.end());
    sample.expert_load_min = *std::min_element(experts.load_min.begin(), experts.load_min.end());
  }
  sample.max_logit = qk_clip_.max_logit;
  sample.clipped_groups = qk_clip_.clipped_groups;
  progress_.Update(sample);
  RETURN_IF_ERROR(ExpertScalars(step, experts));
  RETURN_IF_ERROR(Scalar("train/loss", step, loss));
  RETURN_IF_ERROR(Scalar("train/lr", step, lr));
  if (muon_lr_ > 0) RETURN_IF_ERROR(Scalar("train/muon_lr", step, muon_lr));
  RETURN_IF_ERROR(Scalar("train/grad_norm", step, result.grad_norm));
  if (params_norm_) RETURN_IF_ERROR(Scalar("train/params_norm", step, params_norm));
  if (zero_grads_) RETURN_IF_ERROR(Scalar("train/num_zeros_in_grad", step, zero_grads));
  RETURN_IF_ERROR(Scalar("memory/max_rss_bytes", step, static_cast<double>(MaxRssBytes())));
  RETURN_IF_ERROR(Scalar("train/tokens_per_s", step, tokens_per_s));
  RETURN_IF_ERROR(Scalar("train/step_time_s", step, absl::ToDoubleSeconds(time)));
  RETURN_IF_ERROR(Scalar("time/forward_s", step, cost.forward_s));
  RETURN_IF_ERROR(Scalar("time/backward_s", step, cost.backward_s));
  RETURN_IF_ERROR(Scalar("time/optimizer_s", step, cost.optimizer_s));
  RETURN_IF_ERROR(Scalar("time/cpu_s", step, cost.cpu_s));
  RETURN_IF_ERROR(Scalar("comm/param_gather_wait_s", step, cost.param_gather_wait_s));
  RETURN_IF_ERROR(Scalar("comm/grad_sync_wait_s", step, cost.grad_sync_wait_s));
  RETURN_IF_ERROR(Scalar("comm/exposed_s", step, cost.exposed_comm_s));
  RETURN_IF_ERROR(Scalar("comm/rank_skew_s", step, cost.rank_skew_s));
  return Scalar("comm/bytes", step, static_cast<double>(TrafficOf(mesh_).bytes));
}

absl::Status RunMetrics::ExpertScalars(int64_t step, const ExpertStats& experts) {
  if (!experts.moe) return absl::OkStatus();
  RETURN_IF_ERROR(Scalar("moe/aux_loss", step, experts.aux_loss));
  RETURN_IF_ERROR(Scalar("moe/z_loss", step, experts.z_loss));
  RETURN_IF_ERROR(
      Scalar("comm/all_to_all_bytes", step, static_cast<double>(experts.all_to_all_bytes)));
  for (size_t l = 0; l < experts.load_max.size(); ++l) {
    RETURN_IF_ERROR(Scalar(absl::StrCat("moe/layer", l, "/load_max"), step, experts.load_max[l]));
    RETURN_IF_ERROR(Scalar(absl::StrCat("moe/layer", l, "/load_min"), step, experts.load_min[l]));
  }
  return absl::OkStatus();
}

absl::Status RunMetrics::QkClip(int64_t step, double max_logit, int64_t clipped_groups,
                                bool skipped) {
  const int64_t applied = skipped ? 0 : clipped_groups;
  const bool first = summary_.qk_clip_clipped_groups < 0;
  summary_.qk_clip_max_logit = first ? max_logit : std::max(summary_.qk_clip_max_logit, max_logit);
  summary_.qk_clip_clipped_groups = (first ? 0 : summary_.qk_clip_clipped_groups) + applied;
  qk_clip_.max_logit = max_logit;
  qk_clip_.clipped_groups = applied;
  RETURN_IF_ERROR(Scalar("qk_clip/max_logit", step, max_logit));
  return Scalar("qk_clip/clipped_groups", step, static_cast<double>(applied));
}

absl::Status RunMetrics::InitialEval(double loss) {
  summary_.eval_loss = loss;
  summary_.initial_eval_loss = loss;
  // A fresh run logs it at step 0. A resumed run's params are the checkpoint's, which the run that
  // saved it evaluated at that step if it evaluated there: logging it again would put that step on
  // the curve twice (the restart record purges only from the first resumed step on).
  if (first_step_ > 1) return absl::OkStatus();
  return Scalar("eval/loss", 0, loss);
}

absl::Status RunMetrics::Eval(int64_t step, double loss) {
  summary_.eval_loss = loss;
  RETURN_IF_ERROR(Scalar("eval/loss", step, loss));
  if (comm_.rank() != 0) return absl::OkStatus();
  progress_.Finish();
  std::fprintf(out_, "eval step %lld: loss %.4f\n", static_cast<long long>(step), loss);
  std::fflush(out_);
  return tb_ ? tb_->Flush() : absl::OkStatus();
}

absl::Status RunMetrics::Finish(int64_t skipped_steps) {
  if (comm_.rank() == 0) progress_.Finish();
  summary_.elapsed_s = absl::ToDoubleSeconds(train_time_);
  summary_.tokens_per_s =
      summary_.elapsed_s > 0 ? tokens_per_step_ * StepsRun() / summary_.elapsed_s : 0;
  summary_.skipped_steps = skipped_steps;
  summary_.comm_bytes = TrafficOf(mesh_).bytes;
  const int64_t steps_run = std::max<int64_t>(1, StepsRun());
  summary_.comm_bytes_per_step = totals_.comm_bytes / steps_run;
  summary_.wire_bytes_per_step = totals_.wire_bytes / steps_run;
  summary_.param_gather_wait_s = totals_.param_gather_wait_s / steps_run;
  summary_.grad_sync_wait_s = totals_.grad_sync_wait_s / steps_run;
  if (steady_times_.empty() && StepsRun() >= 1) {  // one step: it is all there is
    steady_times_.push_back(absl::ToDoubleSeconds(first_cost_.time));
    steady_totals_ = first_cost_;
  }
  if (!steady_times_.empty()) {
    std::vector<double> sorted = steady_times_;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    summary_.step_s = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    summary_.forward_s = steady_totals_.forward_s / n;
    summary_.backward_s = steady_totals_.backward_s / n;
    summary_.optimizer_s = steady_totals_.optimizer_s / n;
    summary_.exposed_comm_s = steady_totals_.exposed_comm_s / n;
    summary_.rank_skew_s = steady_totals_.rank_skew_s / n;
    steady_cpu_s_per_step_ = steady_totals_.cpu_s / n;
  }
  for (size_t r = 0; r < summary_.memory.size(); ++r) {
    const RankMemory& m = summary_.memory[r];
    const std::string prefix = absl::StrCat("memory/rank", r, "/");
    RETURN_IF_ERROR(Scalar(prefix + "params_bytes", summary_.steps, m.params_bytes));
    RETURN_IF_ERROR(Scalar(prefix + "grads_bytes", summary_.steps, m.grads_bytes));
    RETURN_IF_ERROR(
        Scalar(prefix + "optimizer_state_bytes", summary_.steps, m.optimizer_state_bytes));
    RETURN_IF_ERROR(
        Scalar(prefix + "peak_transient_bytes", summary_.steps, m.peak_transient_bytes));
    RETURN_IF_ERROR(Scalar(prefix + "max_rss_bytes", summary_.steps, m.max_rss_bytes));
    RETURN_IF_ERROR(
        Scalar(prefix + "allocator_peak_bytes", summary_.steps, m.allocator_peak_bytes));
    RETURN_IF_ERROR(Scalar(prefix + "peak_transient_over_param_buffer", summary_.steps,
                           m.peak_transient_over_param_buffer()));
  }
  return tb_ ? tb_->Flush() : absl::OkStatus();
}

absl::Status RunMetrics::Scalar(absl::string_view tag, int64_t step, double value) {
  if (!tb_) return absl::OkStatus();
  return tb_->AddScalar(tag, step, static_cast<float>(value), NowSeconds());
}

}  // namespace orthoshard::integration
