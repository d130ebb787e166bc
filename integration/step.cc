#include "integration/step.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "data/loader.h"
#include "ddp/distributed_data_parallel.h"
#include "integration/metrics/allocator_stats.h"
#include "integration/rank_values.h"
#include "model/model.h"

namespace orthoshard::integration {
namespace {

using collectives::AllReduceOp;
using collectives::Communicator;
using collectives::ReduceOp;
using data::MicroBatch;
using model::Documents;
using model::LossReduction;

// Token ids as an int64 [rows, cols] tensor on `device` (owning its memory).
at::Tensor ToTensor(const std::vector<int64_t>& ids, int64_t rows, int64_t cols,
                    at::Device device) {
  const at::Tensor view = at::from_blob(const_cast<int64_t*>(ids.data()), {rows, cols},
                                        at::TensorOptions().dtype(at::kLong));
  return device.is_cpu() ? view.clone() : view.to(device);
}

static_assert(data::kIgnoreTarget == model::kIgnoredTarget, "the loader's ignored target is the model's");

// A micro-batch's loss (mean over its counted targets, or their sum), within each row's documents
// when the run has them.
absl::StatusOr<at::Tensor> MicroBatchLoss(const Setup& s, const MicroBatch& b, at::Device device,
                                          LossReduction reduction) {
  const at::Tensor inputs = ToTensor(b.inputs, b.rows, b.cols, device);
  const at::Tensor targets = ToTensor(b.targets, b.rows, b.cols, device);
  if (!s.documents || !b.has_boundaries) {  // one document per row: plain causal attention
    return s.model->Loss(inputs, targets, nullptr, reduction);
  }
  const Documents documents{ToTensor(b.segments, b.rows, b.cols, device),
                            ToTensor(b.positions, b.rows, b.cols, device)};
  return s.model->Loss(inputs, targets, &documents, reduction);
}

// Runs `pass`, a forward or a backward over the model. A DDP hook that fails (a gather from a lost
// peer) records its error and the pass goes on over released params, where LibTorch throws an error
// that names no rank: the hook's error, which names the rank and the collective, is the one
// returned, also when nothing was thrown.
absl::Status RunModelPass(Setup& s, const std::function<absl::Status()>& pass) {
  absl::Status status;
  try {
    status = pass();
  } catch (const c10::Error&) {
    RETURN_IF_ERROR(s.ddp->TakeHookError());
    RETURN_IF_ERROR(s.model->TakeCollectiveError());  // an expert all-to-all in backward
    throw;
  }
  RETURN_IF_ERROR(s.ddp->TakeHookError());
  RETURN_IF_ERROR(s.model->TakeCollectiveError());
  return status;
}

// The passes of one step's micro-batches, for the schedule to order: the forward keeps its loss and
// the objective its backward runs on; the backward adds the micro-batch's part of the step's loss to
// `loss_sum`. Nothing here depends on the order of other micro-batches' passes.
class StepPasses final : public MicroBatchPasses {
 public:
  StepPasses(Setup& s, const Communicator& comm, ExpertStep& experts,
             const std::vector<MicroBatch>& batches, int64_t step, StepCost& cost)
      : s_(s), comm_(comm), experts_(experts), batches_(batches), cost_(cost),
        losses_(batches.size()),
        objectives_(batches.size()),
        // The scale that makes the dp ranks' mean gradient (pre-scaled by 1/dp) the gradient of
        // the step's loss: the mean of the micro-batches' means, or with --eod_mask_loss the sum
        // over every dp rank's counted targets divided by their number (the same on every rank:
        // from the data alone; the tp ranks of a group read the same data).
        per_token_scale_(s.per_token_loss
                             ? static_cast<double>(s.mesh->dp().size()) /
                                   static_cast<double>(
                                       std::max<int64_t>(1, s.train->CountedTargets(step)))
                             : 0.0) {}

  absl::Status Forward(int m) override {
    const absl::Time start = absl::Now();
    RECORD_USER_SCOPE("step/forward");  // named ranges in a --profile_step_start trace
    RETURN_IF_ERROR(RunModelPass(s_, [&]() -> absl::Status {
      ASSIGN_OR_RETURN(losses_[m], MicroBatchLoss(s_, batches_[m], comm_.device(),
                                                  s_.per_token_loss ? LossReduction::kSum
                                                                    : LossReduction::kMean));
      // What backward runs on, taken now: MoE adds the weighted auxiliary losses of this
      // micro-batch, which the model records per forward (the next forward replaces them, and a
      // pipeline schedule runs other forwards before this backward). Nothing for a dense model.
      const double micro_scale = 1.0 / static_cast<double>(batches_.size());
      objectives_[m] = experts_.AddAuxLosses(
          losses_[m].mul(s_.per_token_loss ? per_token_scale_ : micro_scale), micro_scale);
      return absl::OkStatus();
    }));
    cost_.forward_s += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }

  absl::Status Backward(int m, bool syncs_grads) override {
    const absl::Time start = absl::Now();
    s_.ddp->set_is_last_microbatch(syncs_grads);
    const at::Tensor loss = std::move(losses_[m]);
    const at::Tensor objective = std::move(objectives_[m]);
    {
      RECORD_USER_SCOPE("step/backward");
      RETURN_IF_ERROR(RunModelPass(s_, [&]() -> absl::Status {
        objective.backward();
        return absl::OkStatus();
      }));
    }
    // Averaged over the ranks by the step agreement: per rank, loss_sum is what makes that average
    // the step's loss.
    loss_sum_ += s_.per_token_loss ? loss.item<double>() * per_token_scale_ *
                                         static_cast<double>(batches_.size())
                                   : loss.item<double>();
    cost_.backward_s += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }

  double loss_sum() const { return loss_sum_; }

 private:
  Setup& s_;
  const Communicator& comm_;
  ExpertStep& experts_;
  const std::vector<MicroBatch>& batches_;
  StepCost& cost_;
  std::vector<at::Tensor> losses_;      // a forward's loss, until its backward
  std::vector<at::Tensor> objectives_;  // what its backward runs on (loss, scaled, + MoE aux)
  const double per_token_scale_;
  double loss_sum_ = 0;
};

}  // namespace

absl::StatusOr<StepOutcome> RunStep(Setup& s, Communicator& comm, StepAgreement& agreement,
                                    ExpertStep& experts, const StepSchedule& schedule,
                                    int stop_signal, bool save_written, QkClip* qk_clip) {
  const absl::Time start = absl::Now();
  const double cpu_start = ProcessCpuSeconds();
  const MeshTraffic traffic_before = TrafficOf(*s.mesh);
  const ddp::DdpWaits waits_before = s.ddp->waits();
  StepOutcome out;
  s.ddp->ZeroGradBuffers();
  if (qk_clip != nullptr) qk_clip->BeginStep();
  const int64_t step = s.train->state().step;
  const std::vector<MicroBatch> batches = s.train->Next();
  StepPasses passes(s, comm, experts, batches, step, out.cost);
  RETURN_IF_ERROR(schedule.Run(static_cast<int>(batches.size()), passes));
  {
    RECORD_USER_SCOPE("step/grad_sync_wait");
    RETURN_IF_ERROR(s.ddp->FinishGradSync());
    const ddp::DdpWaits waited = s.ddp->waits();
    agreement.Set(passes.loss_sum() / static_cast<double>(batches.size()), stop_signal,
                  save_written, waited.param_gather_s + waited.grad_sync_s);
    RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{agreement.tensor(), {ReduceOp::kAvg}}}));
    ASSIGN_OR_RETURN(out.experts, experts.Finish(comm, static_cast<int>(batches.size())));
  }
  {
    RECORD_USER_SCOPE("step/optimizer");
    const absl::Time optimizer_start = absl::Now();
    at::NoGradGuard no_grad;  // the optimizers update leaf params in place
    if (qk_clip != nullptr) {
      ASSIGN_OR_RETURN(out.qk_clip, qk_clip->Prepare(comm, *s.optimizer));
    }
    ASSIGN_OR_RETURN(out.result, s.optimizer->Step());  // starts the param sync
    out.cost.optimizer_s = absl::ToDoubleSeconds(absl::Now() - optimizer_start);
  }
  out.cost.time = absl::Now() - start;
  out.cost.cpu_s = ProcessCpuSeconds() - cpu_start;
  const MeshTraffic traffic = TrafficOf(*s.mesh);
  out.cost.comm_bytes = traffic.bytes - traffic_before.bytes;
  out.cost.wire_bytes = traffic.wire_bytes - traffic_before.wire_bytes;
  out.experts.all_to_all_bytes = traffic.all_to_all_bytes - traffic_before.all_to_all_bytes;
  out.experts.all_to_all_wire_bytes =
      traffic.all_to_all_wire_bytes - traffic_before.all_to_all_wire_bytes;
  out.cost.param_gather_wait_s = s.ddp->waits().param_gather_s - waits_before.param_gather_s;
  out.cost.grad_sync_wait_s = s.ddp->waits().grad_sync_s - waits_before.grad_sync_s;
  out.agreed = agreement.Read();
  out.cost.exposed_comm_s = out.agreed.min_comm_wait_s;
  out.cost.rank_skew_s = out.agreed.max_comm_wait_s - out.agreed.min_comm_wait_s;
  return out;
}

absl::StatusOr<double> Evaluate(Setup& s, Communicator& comm) {
  at::NoGradGuard no_grad;
  double total = 0, counted = 0;
  const std::vector<MicroBatch> batches = s.eval->BatchAt(0);
  for (const MicroBatch& b : batches) {
    at::Tensor loss;
    RETURN_IF_ERROR(RunModelPass(s, [&]() -> absl::Status {
      ASSIGN_OR_RETURN(loss, MicroBatchLoss(s, b, comm.device(),
                                            s.per_token_loss ? LossReduction::kSum
                                                             : LossReduction::kMean));
      return absl::OkStatus();
    }));
    total += loss.item<double>();
    counted += static_cast<double>(b.counted_targets);
  }
  if (s.per_token_loss) {
    at::Tensor sums = at::tensor({total, counted}, at::kDouble).to(comm.device());
    RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{sums, {ReduceOp::kSum}}}));
    sums = sums.cpu();
    return sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  }
  at::Tensor mean = ScalarOn(comm, total / static_cast<double>(batches.size()));
  RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{mean, {ReduceOp::kAvg}}}));
  return ValueOf(mean);
}

}  // namespace orthoshard::integration
