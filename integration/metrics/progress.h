// A one-line training progress display: step, loss, tokens/s, learning rate and ETA.
//
// On a terminal the line is redrawn in place with '\r' on every update; otherwise (a pipe, a file, a
// CI log) a plain line ending in '\n' is written every `log_every` steps and at the last step, so logs
// stay readable. Formatting is a pure function (FormatProgress) so it can be tested without a terminal.
#ifndef ORTHOSHARD_INTEGRATION_METRICS_PROGRESS_H_
#define ORTHOSHARD_INTEGRATION_METRICS_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace orthoshard::integration {

// One observation of the training loop.
struct ProgressSample {
  int64_t step = 0;           // steps completed so far, 1-based
  double loss = 0.0;          // training loss of this step
  double tokens_per_s = 0.0;  // throughput, all ranks together
  double lr = 0.0;            // learning rate used by this step
  double elapsed_s = 0.0;     // seconds since the first step started
  // Shown when >= 0: Muon's learning rate, the gradient norm clipping saw, the params' norm and
  // the count of zero gradient elements.
  double muon_lr = -1.0;
  double grad_norm = -1.0;
  double params_norm = -1.0;
  double zero_grads = -1.0;
  // MoE, shown when >= 0: the auxiliary load-balancing loss, and the busiest and idlest expert's
  // load relative to the mean over every layer (" | aux 1.0123 | load 0.62-1.41").
  double moe_aux_loss = -1.0;
  double expert_load_min = -1.0;
  double expert_load_max = -1.0;
  // Shown when clipped_groups >= 0 (QK-clip on): the step's largest attention logit and the KV
  // groups it clipped.
  double max_logit = 0.0;
  int64_t clipped_groups = -1;
};

struct ProgressOptions {
  int64_t total_steps = 0;  // > 0; the ETA assumes the remaining steps run at the average pace so far
  int64_t log_every = 10;   // non-terminal output: a line every this many steps (>= 1)
  bool terminal = false;    // true: redraw one line with '\r'; see IsTerminal
};

// "step 20/200 | loss 3.4567 | 12.3k tok/s | lr 1.00e-03 | ETA 1m12s": no line ending.
// Tokens/s uses k/M suffixes above 1e4/1e7; the ETA is "?" before any time has elapsed.
std::string FormatProgress(const ProgressSample& sample, int64_t total_steps);

// "1h02m03s", "4m05s", "7s" for a non-negative number of seconds (rounded down).
std::string FormatDuration(double seconds);

// True when `stream` refers to a terminal (isatty on its file descriptor).
bool IsTerminal(std::FILE* stream);

// Writes progress to a stream it does not own. Not thread-safe; call from the training loop only.
class ProgressPrinter {
 public:
  // Precondition: `out` stays valid while the printer is used; options.total_steps > 0 and
  // options.log_every >= 1 (smaller values are clamped to 1).
  ProgressPrinter(std::FILE* out, ProgressOptions options);

  // Shows `sample`: always on a terminal, else when the step is a multiple of log_every or the last.
  void Update(const ProgressSample& sample);

  // Ends the redrawn line with '\n' on a terminal so the next output starts on a fresh line;
  // does nothing otherwise or when nothing was drawn. Safe to call more than once.
  void Finish();

 private:
  std::FILE* out_;
  ProgressOptions options_;
  size_t last_width_ = 0;  // terminal: length of the line on screen, to blank leftovers
  bool line_open_ = false;
};

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_METRICS_PROGRESS_H_
