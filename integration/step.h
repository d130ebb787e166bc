// One training step over what Build (setup.h) made, and the eval loss: the micro-batches' passes
// in the order a StepSchedule gives, the grad sync, the step agreement and the update. Internal to
// //integration:trainer.
#ifndef ORTHOSHARD_INTEGRATION_STEP_H_
#define ORTHOSHARD_INTEGRATION_STEP_H_

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "integration/experts.h"
#include "integration/metrics/run_metrics.h"
#include "integration/qk_clip.h"
#include "integration/setup.h"
#include "integration/step_agreement.h"
#include "integration/step_schedule.h"
#include "optimizers/chained.h"

namespace orthoshard::integration {

// What one step produced.
struct StepOutcome {
  optimizers::StepResult result;
  ExpertStats experts;           // MoE: the same on every rank (all_to_all_bytes: this rank's)
  StepAgreement::Agreed agreed;  // the same on every rank
  StepCost cost;                 // this rank's
  QkClipStats qk_clip;           // with --qk_clip_threshold; the same on every rank
};

// One optimizer step: the micro-batches' forwards and backwards in `schedule`'s order (DDP syncs
// grads during the last backward: reduce-scatter, or all-reduce for replicated), the step agreement
// folded into one all-reduce, this rank's part of the update, and the start of the param
// all-gathers that the next forward's pre-forward hooks wait on layer by layer (nothing to gather
// for replicated). With `qk_clip` (may be null) the forwards record their max logits and the update
// clips the qkv weights.
absl::StatusOr<StepOutcome> RunStep(Setup& s, collectives::Communicator& comm,
                                    StepAgreement& agreement, ExpertStep& experts,
                                    const StepSchedule& schedule, int stop_signal,
                                    bool save_written, QkClip* qk_clip);

// Eval loss over every rank's fixed eval micro-batches: the mean of the micro-batches' means, or
// with --eod_mask_loss the mean over all counted targets.
absl::StatusOr<double> Evaluate(Setup& s, collectives::Communicator& comm);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_STEP_H_
