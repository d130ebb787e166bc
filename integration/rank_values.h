// Small collectives of the trainer on scalars: a one-element tensor on the communicator's device,
// a group launched and waited for, a value summed over the ranks. Internal to //integration:trainer.
#ifndef ORTHOSHARD_INTEGRATION_RANK_VALUES_H_
#define ORTHOSHARD_INTEGRATION_RANK_VALUES_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace orthoshard::integration {

// A float64 [1] tensor holding `value` on the communicator's device, for a scalar collective.
at::Tensor ScalarOn(const collectives::Communicator& comm, double value);

// The value of a one-element tensor on any device (one device-to-host copy).
double ValueOf(const at::Tensor& t);

// Launches `ops` as one group and waits for it.
absl::Status RunGroup(collectives::Communicator& comm, std::vector<collectives::CollectiveOp> ops);

// `value` summed over the ranks of `comm` (in fp64), the same on every rank.
absl::StatusOr<double> SumOverRanks(collectives::Communicator& comm, double value);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_RANK_VALUES_H_
