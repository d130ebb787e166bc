#include "integration/run_report.h"

#include <csignal>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "layout/layout.h"
#include "model/gpt_config.h"
#include "model/model.h"

namespace orthoshard::integration {
namespace {

using collectives::Communicator;
using model::SavedModel;

// "SIGTERM", "SIGINT", "SIGHUP" (the signals pretrain stops on), or "signal N".
std::string SignalName(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return absl::StrCat("signal ", signal_number);
  }
}

// The startup line's recompute: "" without, else ", recompute full" (", ... of the first N blocks").
std::string RecomputeText(const TrainerConfig& c) {
  if (c.recompute == RecomputeMode::kNone) return "";
  return absl::StrCat(", recompute ", ChoiceName(c.recompute),
                      c.recompute_layers >= 0
                          ? absl::StrCat(" (the first ", c.recompute_layers, " blocks)")
                          : std::string());
}

// The startup line's account of documents.
std::string DocumentsSummary(const Setup& s) {
  const std::string how =
      s.documents ? ": attention and positions restart after each"
                  : ": attention crosses documents (--reset_attention_mask=false)";
  if (s.eod_token >= 0) {
    return absl::StrCat("documents end with token ", s.eod_token, how,
                        s.per_token_loss ? ", loss after EOD masked" : "");
  }
  if (s.index_documents > 1) {
    return absl::StrCat("no end-of-document token; the .idx records ", s.index_documents,
                        " documents", how);
  }
  return "no end-of-document token: the data is one stream";
}

// Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16), from /proc/cpuinfo's flags.
// Without it ATen's bf16 GEMMs take a fallback path: measured 10-40x slower than fp32 GEMMs on an
// AVX2-only EPYC (BENCHMARKS.md section 8).
bool CpuHasBf16Arithmetic() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return true;  // unknown: no warning
  char line[8192];
  bool has = false;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "flags", 5) != 0) continue;
    has = std::strstr(line, " avx512_bf16") != nullptr || std::strstr(line, " amx_bf16") != nullptr;
    break;
  }
  std::fclose(f);
  return has;
}

}  // namespace

std::string ModelConfigString(const TrainerConfig& c, const Setup& s) {
  SavedModel saved;
  saved.preset = c.model;
  saved.config = s.model->config();
  saved.seq_len = s.seq_len;
  saved.precision = ChoiceName(c.precision);
  if (s.eod_token >= 0) {
    saved.documents = absl::StrCat("eod", s.eod_token, s.documents ? ",reset" : "",
                                   s.per_token_loss ? ",mask_loss" : "");
  } else if (s.documents) {
    saved.documents = "index,reset";
  }
  return model::FormatSavedModel(saved);
}

std::string OptimizerConfigString(const TrainerConfig& c) {
  return absl::StrCat("optimizer=", ChoiceName(c.optimizer));
}

void PrintRunHeader(const TrainerConfig& c, const Setup& s, const Communicator& comm,
                    std::FILE* out) {
  if (c.precision == Precision::kBf16 && !comm.device().is_cuda() && !CpuHasBf16Arithmetic()) {
    std::fputs("pretrain: warning: --precision=bf16 on a CPU without AVX512-BF16 or AMX: ATen "
               "runs bf16 matrix products on a fallback path, several times slower than fp32 "
               "(--precision=fp32 trains faster here)\n",
               out);
  }
  // Every expert's params, as the summary counts them; with tp or ep > 1 also what each rank holds
  // (its tp slices; the dense params and E / ep experts).
  const collectives::MeshGrid& grid = s.mesh->grid();
  const int64_t params = model::GptParamCount(s.model->config());
  std::string held;
  if (s.model->num_params() != params) {
    std::vector<std::string> at;
    if (s.model->tensor_parallel().size() > 1) {
      at.push_back(absl::StrCat("tp ", s.model->tensor_parallel().size()));
    }
    if (s.model->expert_parallel().size() > 1) {
      at.push_back(absl::StrCat("ep ", s.model->expert_parallel().size()));
    }
    held = absl::StrFormat(", %d per rank at %s", s.model->num_params(), absl::StrJoin(at, ", "));
  }
  std::fprintf(out,
               "pretrain: model %s (%lld params%s), data %s (%lld train / %lld eval tokens, "
               "unigram entropy %.3f nats), %d ranks%s, dist %s, optimizer %s%s\n"
               "pretrain: global batch %lld = %d %s x %lld micro-batches x %lld samples x "
               "%lld tokens\n",
               c.model.c_str(), static_cast<long long>(params), held.c_str(), c.data.c_str(),
               static_cast<long long>(s.train_tokens), static_cast<long long>(s.eval_tokens),
               s.unigram_entropy, comm.size(),
               grid.tp > 1 ? absl::StrFormat(" (tp %d x dp %d)", grid.tp, grid.dp).c_str() : "",
               ChoiceName(c.dist), ChoiceName(c.optimizer), RecomputeText(c).c_str(),
               static_cast<long long>(c.global_batch), grid.dp, grid.tp > 1 ? "dp ranks" : "ranks",
               static_cast<long long>(c.micro_batches), static_cast<long long>(s.micro_batch_size),
               static_cast<long long>(s.seq_len));
  std::fprintf(out, "pretrain: vocabulary %lld (from %s), eval on %s, %s\n",
               static_cast<long long>(s.model->config().vocab_size), s.vocab_source.c_str(),
               s.eval_source.c_str(),
               DocumentsSummary(s).c_str());
  std::fputs(s.routing.ToString().c_str(), out);
  std::fputs(LayoutSummary(s.layout).c_str(), out);
  std::fflush(out);
}

absl::Status ReportEnd(const TrainerConfig& c, const Communicator& comm, const TrainOptions& options,
                       const TrainSummary& summary, const StepPlan& plan,
                       int64_t consecutive_skips) {
  const bool saved = !c.save_dir.empty();
  if (plan.give_up) {
    return absl::AbortedError(absl::StrCat(
        "stopping at step ", summary.steps, ": ", consecutive_skips,
        " consecutive steps had non-finite gradients (--max_consecutive_skips=",
        c.max_consecutive_skips, ")",
        saved ? absl::StrCat("; final checkpoint of step ", summary.steps, " saved in ", c.save_dir)
              : std::string("; no --save_dir, nothing saved")));
  }
  if (comm.rank() == 0 && summary.stop_signal != 0) {
    std::fprintf(options.out, "pretrain: stopped after step %lld of %lld on %s; %s\n",
                 static_cast<long long>(summary.steps), static_cast<long long>(LastStep(c)),
                 SignalName(summary.stop_signal).c_str(),
                 saved ? absl::StrCat("checkpoint of step ", summary.steps, " saved in ",
                                      c.save_dir, ": continue with --resume")
                             .c_str()
                       : "no --save_dir, nothing saved");
    std::fflush(options.out);
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::integration
