#include "integration/rank_values.h"

#include <ATen/ops/full.h>

#include <memory>
#include <utility>

#include "common/status_macros.h"

namespace orthoshard::integration {

using collectives::AllReduceOp;
using collectives::Communicator;
using collectives::ReduceOp;

at::Tensor ScalarOn(const Communicator& comm, double value) {
  return at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(comm.device()));
}

double ValueOf(const at::Tensor& t) { return t.item<double>(); }

absl::Status RunGroup(Communicator& comm, std::vector<collectives::CollectiveOp> ops) {
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, comm.LaunchGroup(std::move(ops)));
  return work->Wait(comm.timeout());
}

absl::StatusOr<double> SumOverRanks(Communicator& comm, double value) {
  at::Tensor t = ScalarOn(comm, value);
  RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{t, {ReduceOp::kSum}}}));
  return ValueOf(t);
}

}  // namespace orthoshard::integration
