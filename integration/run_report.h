// What a run says about itself: the configs a checkpoint records (and a resume compares), rank 0's
// start-up report, and the end of the run (giving up on non-finite gradients, or stopped by a
// signal). Internal to //integration:trainer.
#ifndef ORTHOSHARD_INTEGRATION_RUN_REPORT_H_
#define ORTHOSHARD_INTEGRATION_RUN_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "integration/config/train_options.h"
#include "integration/config/trainer_config.h"
#include "integration/run_policy.h"
#include "integration/setup.h"

namespace orthoshard::integration {

// The configs a checkpoint records; a resume must match them (trainer.h: "incompatible").
std::string ModelConfigString(const TrainerConfig& c, const Setup& s);
std::string OptimizerConfigString(const TrainerConfig& c);

// Rank 0's start-up report: model, data, ranks, batch shape, routing and layout.
void PrintRunHeader(const TrainerConfig& c, const Setup& s, const collectives::Communicator& comm,
                    std::FILE* out);

// How the run ended, after its last step: an error when it gave up on non-finite gradients, a line
// on out when a signal stopped it.
absl::Status ReportEnd(const TrainerConfig& c, const collectives::Communicator& comm,
                       const TrainOptions& options, const TrainSummary& summary,
                       const StepPlan& plan, int64_t consecutive_skips);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_RUN_REPORT_H_
