// What the ranks agree on after each step, carried by the one all-reduce (AVG) the step runs anyway
// for its loss, so agreeing costs no extra collective: the mean loss; whether any rank was asked to
// stop, and by which signal; whether every rank's part of the background save is written; and the
// least and the most time any rank spent blocked on communication since the previous agreement.
//
// The last pair tells communication from imbalance. A rank that reaches a collective first waits
// for the others (rank skew: uneven work, a noisy machine), the last one to arrive waits only for
// the transfer itself. So the least wait over the ranks is the communication the step's critical
// path did not hide (what overlap can still win), and the spread between the most and the least is
// skew, which no overlap can hide. Each rank's wait has a slot of its own (world doubles); the AVG
// turns slot r into wait_r / world.
#ifndef ORTHOSHARD_INTEGRATION_STEP_AGREEMENT_H_
#define ORTHOSHARD_INTEGRATION_STEP_AGREEMENT_H_

#include <ATen/core/Tensor.h>

#include "collectives/communicator.h"

namespace orthoshard::integration {

class StepAgreement {
 public:
  struct Agreed {
    double loss = 0;
    int stop_signal = 0;  // 0: no rank was asked to stop
    bool save_written_everywhere = false;
    double min_comm_wait_s = 0;  // the least any rank waited on communication (critical path)
    double max_comm_wait_s = 0;  // the most any rank waited (its excess over the least: skew)
  };

  explicit StepAgreement(const collectives::Communicator& comm);

  // This rank's values, before the all-reduce of tensor(). `comm_wait_total_s` is the time this rank
  // has waited on communication so far (a running total); the agreement carries what it grew by
  // since the previous Set (since construction for the first).
  void Set(double loss, int stop_signal, bool save_written, double comm_wait_total_s);

  // Averaged over ranks in place by the step's all-reduce (AVG).
  const at::Tensor& tensor() const { return values_; }

  // After the all-reduce: the same on every rank (one device-to-host copy).
  Agreed Read() const;

 private:
  int world_;
  int rank_;
  double waited_before_ = 0;  // comm_wait_total_s at the previous Set
  // [loss, stop requested, signal number, save written, wait of rank 0, ..., wait of rank world-1]:
  // this rank's values (the other ranks' wait slots 0), then their mean.
  at::Tensor values_;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_STEP_AGREEMENT_H_
