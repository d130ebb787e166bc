#include "integration/step_agreement.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace orthoshard::integration {
namespace {
constexpr int64_t kFixedSlots = 4;  // loss, stop requested, signal number, save written
}  // namespace

StepAgreement::StepAgreement(const collectives::Communicator& comm)
    : world_(comm.size()),
      rank_(comm.rank()),
      values_(at::zeros({kFixedSlots + comm.size()},
                        at::TensorOptions().dtype(at::kDouble).device(comm.device()))) {}

void StepAgreement::Set(double loss, int stop_signal, bool save_written,
                        double comm_wait_total_s) {
  values_.zero_();  // the all-reduce left the other ranks' means in their slots
  values_.select(0, 0).fill_(loss);
  values_.select(0, 1).fill_(stop_signal != 0 ? 1.0 : 0.0);
  values_.select(0, 2).fill_(static_cast<double>(stop_signal));
  values_.select(0, 3).fill_(save_written ? 1.0 : 0.0);
  values_.select(0, kFixedSlots + rank_).fill_(comm_wait_total_s - waited_before_);
  waited_before_ = comm_wait_total_s;
}

StepAgreement::Agreed StepAgreement::Read() const {
  const at::Tensor host = values_.cpu();
  const double* mean = host.data_ptr<double>();
  Agreed agreed;
  agreed.loss = mean[0];
  // Counts come back as count / world; the signal as the signalled ranks' mean signal number.
  if (const int64_t signalled = std::llround(mean[1] * world_); signalled > 0) {
    agreed.stop_signal = static_cast<int>(std::llround(mean[2] * world_ / signalled));
  }
  agreed.save_written_everywhere = std::llround(mean[3] * world_) == world_;
  const double* waits = mean + kFixedSlots;  // wait_r / world
  const auto [least, most] = std::minmax_element(waits, waits + world_);
  agreed.min_comm_wait_s = *least * world_;
  agreed.max_comm_wait_s = *most * world_;
  return agreed;
}

}  // namespace orthoshard::integration
