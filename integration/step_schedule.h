// The order in which one step runs its micro-batches' forwards and backwards: the seam where a
// pipeline schedule plugs in. The step (integration/step.h) says what a micro-batch's forward and
// backward are; a schedule says only when each runs and which backward synchronises the grads.
//
// Today's schedule, SequentialSchedule, is the one without pipeline stages: forward and backward
// of each micro-batch in turn (Megatron's forward_backward_no_pipelining). A pipeline schedule
// (1F1B, interleaved) is another StepSchedule over the same passes, with the stage's sends and
// receives inside its passes; DDP's hooks, recompute, fsdp's gathers and MoE's all-to-alls run
// inside the passes and need nothing from the schedule but the grad-sync flag.
//
// LibTorch-free: a schedule orders calls, it never touches a tensor.
#ifndef ORTHOSHARD_INTEGRATION_STEP_SCHEDULE_H_
#define ORTHOSHARD_INTEGRATION_STEP_SCHEDULE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoshard::integration {

// What a schedule runs: the forward and the backward of micro-batch m of the step, m in
// [0, micro_batches). Implemented by the step over the model and DDP.
class MicroBatchPasses {
 public:
  virtual ~MicroBatchPasses() = default;
  // The forward of micro-batch m (its loss is kept by the passes for its backward).
  virtual absl::Status Forward(int m) = 0;
  // The backward of micro-batch m, whose forward has run. `syncs_grads`: this is the step's last
  // backward, during which the gradients are synchronised over the data-parallel ranks (DDP's
  // is_last_microbatch; Megatron enables grad sync before the last backward the same way).
  virtual absl::Status Backward(int m, bool syncs_grads) = 0;
};

// A schedule of one step's micro-batch passes. Every schedule runs each forward once and each
// backward once after its forward, and gives `syncs_grads` to the last backward it runs and to no
// other (step_schedule_test checks these for every schedule). The first failing pass ends the run
// and its status is returned.
class StepSchedule {
 public:
  virtual ~StepSchedule() = default;
  virtual absl::string_view name() const = 0;
  // Runs micro-batches 0..micro_batches-1 (micro_batches >= 1, else kInvalidArgument).
  virtual absl::Status Run(int micro_batches, MicroBatchPasses& passes) const = 0;
};

// No pipeline: F0 B0 F1 B1 ... in order, so one micro-batch's activations are alive at a time.
class SequentialSchedule final : public StepSchedule {
 public:
  absl::string_view name() const override { return "sequential"; }
  absl::Status Run(int micro_batches, MicroBatchPasses& passes) const override;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_STEP_SCHEDULE_H_
