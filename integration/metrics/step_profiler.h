// Operator-level profile of a range of training steps: LibTorch's Kineto profiler (the one behind
// torch.profiler) records every ATen op, autograd node and the trainer's own phases of steps
// [first, last] on each rank, and writes one Chrome trace per rank, readable by Perfetto,
// chrome://tracing, TensorBoard's profile plugin and bench/trace_ops.py. The same format as
// torch.profiler's export_chrome_trace, so a PyTorch peer's trace compares op by op.
//
// Kept in its own target: the profiler headers are heavy and only this file includes them.
#ifndef ORTHOSHARD_INTEGRATION_METRICS_STEP_PROFILER_H_
#define ORTHOSHARD_INTEGRATION_METRICS_STEP_PROFILER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace orthoshard::integration {

class StepProfiler {
 public:
  // A profiler of steps [first, last] (1-based, inclusive) that writes
  // `dir`/rank<rank>.steps<first>-<last>.pt.trace.json, with the GPU's kernels too when `cuda`.
  // `first` <= 0 disables it: every call is a no-op. The directory is created if missing; an error
  // names it.
  static absl::StatusOr<std::unique_ptr<StepProfiler>> Create(const std::string& dir,
                                                              int64_t first, int64_t last,
                                                              int rank, bool cuda);
  ~StepProfiler();

  // Starts recording when `step` is the first profiled one.
  void BeforeStep(int64_t step);
  // Whether AfterStep(step, final) stops the profiler. Asynchronous collectives launched while it
  // records carry its thread-local state (c10d propagates it to the work); the caller finishes them
  // before the profiler stops, since LibTorch's profiler state must not outlive the stop (a use
  // after free in KinetoThreadLocalState's destructor otherwise).
  bool StopsAfter(int64_t step, bool final) const {
    return recording_ && (step >= last_ || final);
  }
  // Stops after the last profiled step (or at `step` when the run ends early: `final`) and writes
  // the trace: to a temporary name first, renamed when complete, so a trace file is whole or absent.
  absl::Status AfterStep(int64_t step, bool final);

  // The trace's path.
  const std::string& path() const { return path_; }

 private:
  StepProfiler(std::string path, int64_t first, int64_t last, bool cuda);

  std::string path_;
  int64_t first_;
  int64_t last_;
  bool cuda_;
  bool recording_ = false;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_METRICS_STEP_PROFILER_H_
