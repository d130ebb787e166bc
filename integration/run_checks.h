// What the ranks compare and gather about the model they train: the exact param checksum (a
// divergence between copies fails the run) and each rank's memory. Internal to
// //integration:trainer.
#ifndef ORTHOSHARD_INTEGRATION_RUN_CHECKS_H_
#define ORTHOSHARD_INTEGRATION_RUN_CHECKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "integration/config/trainer_config.h"
#include "integration/setup.h"

namespace orthoshard::integration {

// The exact sum of every param (common/exact_sum.h), the same on every rank and for bitwise-equal
// params at any rank count, tp, ep or layout: the dense params' over the data-parallel ranks (the
// copies of this tp rank's slices), added over the tp group (every slice once), plus, for MoE, the
// experts' over each expt_dp group (the copies of an ep rank's experts) added over the ep group
// (every expert once).
absl::StatusOr<double> ParamChecksum(Setup& s, int64_t step, bool* compared);

// What every rank holds (params, grads, optimizer state, transient peak, and against it the whole
// param buffers and fsdp's stated bound), one row per rank.
absl::StatusOr<std::vector<RankMemory>> GatherRankMemory(Setup& s,
                                                        collectives::Communicator& comm);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_RUN_CHECKS_H_
