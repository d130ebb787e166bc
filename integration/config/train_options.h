// How the process that runs a training passes itself in: where progress and warnings go, the
// graceful-stop flag its signal handlers set, and a fault-injection hook for tests. Separate from
// TrainerConfig (what the run is told) so that the trainer's parts (metrics, checkpointer) can take
// it without including the trainer.
#ifndef ORTHOSHARD_INTEGRATION_CONFIG_TRAIN_OPTIONS_H_
#define ORTHOSHARD_INTEGRATION_CONFIG_TRAIN_OPTIONS_H_

#include <atomic>
#include <cstdio>
#include <functional>

#include "absl/status/status.h"

namespace orthoshard::integration {

struct TrainOptions {
  std::FILE* out = stdout;        // progress and start-up report (rank 0 only); not owned
  bool terminal = false;          // redraw the progress line in place (see ProgressPrinter)
  std::FILE* err = stderr;        // failed saves that training survives (every rank); not owned
  // A graceful stop: a signal handler (pretrain's, for SIGINT and SIGTERM) stores the signal number
  // here. Read once per step; when it is non-zero on any rank, every rank finishes that step, skips
  // the eval, saves the step as a final checkpoint when config.save_dir is set, and Train returns
  // OK with TrainSummary::stop_signal set. May be null; not owned.
  const std::atomic<int>* stop_signal = nullptr;
  // Fault injection for tests, passed to every checkpoint save (checkpoint::SaveOptions): called
  // after this rank's shard is written; a non-OK result is this rank's write failure. Leave empty.
  std::function<absl::Status()> after_shard_written;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_CONFIG_TRAIN_OPTIONS_H_
