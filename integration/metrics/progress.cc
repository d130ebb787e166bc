#include "integration/metrics/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace orthoshard::integration {

std::string FormatDuration(double seconds) {
  if (!(seconds > 0.0)) seconds = 0.0;
  const int64_t total = static_cast<int64_t>(std::floor(seconds));
  const int64_t h = total / 3600;
  const int64_t m = (total % 3600) / 60;
  const int64_t s = total % 60;
  if (h > 0) return absl::StrFormat("%dh%02dm%02ds", h, m, s);
  if (m > 0) return absl::StrFormat("%dm%02ds", m, s);
  return absl::StrFormat("%ds", s);
}

namespace {

std::string FormatRate(double tokens_per_s) {
  if (tokens_per_s >= 1e7) return absl::StrFormat("%.1fM", tokens_per_s / 1e6);
  if (tokens_per_s >= 1e4) return absl::StrFormat("%.1fk", tokens_per_s / 1e3);
  return absl::StrFormat("%.0f", tokens_per_s);
}

}  // namespace

std::string FormatProgress(const ProgressSample& sample, int64_t total_steps) {
  std::string eta = "?";
  if (sample.step > 0 && sample.elapsed_s > 0.0) {
    const double per_step = sample.elapsed_s / static_cast<double>(sample.step);
    const int64_t remaining = std::max<int64_t>(total_steps - sample.step, 0);
    eta = FormatDuration(per_step * static_cast<double>(remaining));
  }
  std::string extra;
  if (sample.muon_lr >= 0) absl::StrAppendFormat(&extra, " | muon lr %.2e", sample.muon_lr);
  if (sample.grad_norm >= 0) absl::StrAppendFormat(&extra, " | grad norm %.3g", sample.grad_norm);
  if (sample.params_norm >= 0) {
    absl::StrAppendFormat(&extra, " | params norm %.4g", sample.params_norm);
  }
  if (sample.zero_grads >= 0) absl::StrAppendFormat(&extra, " | zeros %.0f", sample.zero_grads);
  if (sample.moe_aux_loss >= 0) absl::StrAppendFormat(&extra, " | aux %.4f", sample.moe_aux_loss);
  if (sample.expert_load_max >= 0) {
    absl::StrAppendFormat(&extra, " | load %.2f-%.2f", sample.expert_load_min,
                          sample.expert_load_max);
  }
  if (sample.clipped_groups >= 0) {
    absl::StrAppendFormat(&extra, " | max logit %.4g (%d clipped)", sample.max_logit,
                          sample.clipped_groups);
  }
  return absl::StrFormat("step %d/%d | loss %.4f | %s tok/s | lr %.2e%s | ETA %s", sample.step,
                         total_steps, sample.loss, FormatRate(sample.tokens_per_s), sample.lr,
                         extra, eta);
}

bool IsTerminal(std::FILE* stream) { return stream != nullptr && isatty(fileno(stream)) == 1; }

ProgressPrinter::ProgressPrinter(std::FILE* out, ProgressOptions options)
    : out_(out), options_(options) {
  options_.log_every = std::max<int64_t>(options_.log_every, 1);
}

void ProgressPrinter::Update(const ProgressSample& sample) {
  const std::string line = FormatProgress(sample, options_.total_steps);
  if (options_.terminal) {
    // Pad with spaces so a shorter line fully covers the previous one.
    const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
    std::fprintf(out_, "\r%s%s", line.c_str(), std::string(pad, ' ').c_str());
    last_width_ = line.size();
    line_open_ = true;
  } else {
    const bool last = sample.step >= options_.total_steps;
    if (sample.step % options_.log_every != 0 && !last) return;
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::Finish() {
  if (!line_open_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  line_open_ = false;
  last_width_ = 0;
}

}  // namespace orthoshard::integration
