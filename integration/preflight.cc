#include "integration/preflight.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "data/data_spec.h"
#include "data/dataset.h"
#include "integration/training_data.h"
#include "model/gpt_config.h"

namespace orthoshard::integration {

using ::orthoshard::model::GptConfig;
using ::orthoshard::model::GptPreset;
using ::orthoshard::model::GptParamCount;
using ::orthoshard::model::GptHiddenMatrixCount;
using ::orthoshard::data::DatasetSpecResidentBytes;
namespace {

// The first line of `path` as a number; nullopt when missing or not a number ("max").
std::optional<int64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int64_t value = 0;
  if (!std::getline(in, line) || !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &value)) {
    return std::nullopt;
  }
  return value;
}

std::string GiB(int64_t bytes) { return absl::StrFormat("%.1f GiB", bytes / 1073741824.0); }

}  // namespace

MachineResources ProbeMachine() {
  MachineResources m;
  cpu_set_t set;
  CPU_ZERO(&set);
  m.cores = sched_getaffinity(0, sizeof(set), &set) == 0
                ? CPU_COUNT(&set)
                : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      m.available_bytes = kib * 1024;
      break;
    }
  }
  for (const auto& [limit, usage] :
       {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory.max",
                                            "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const std::optional<int64_t> max = ReadNumber(limit), used = ReadNumber(usage);
    if (max.has_value() && used.has_value() && *max > *used && *max < (int64_t{1} << 60)) {
      const int64_t left = *max - *used;
      m.available_bytes = m.available_bytes > 0 ? std::min(m.available_bytes, left) : left;
    }
  }
  return m;
}

namespace {

// A lower bound on the activations autograd keeps for the backward of one micro-batch of `tokens`
// tokens, in bytes (see MinBytesPerRank): per token and block, what the block's backward certainly
// reads -- the two norms' inputs and outputs (4 C: the inputs of the norms, of QKV and of fc1), the
// fused QKV output ((H + 2 KV) D / tp: v, a view of it, is saved by attention) and a dense MLP's
// fused fc1 output and SwiGLU output (3 F / tp: SwiGLU's and fc2's inputs); an MoE MLP's are left
// out (they follow the routing). Rotated q and k, the attention output and the softmax statistics
// come on top. --recompute=full keeps of each recomputed block only its input (C) and, during its
// backward, one block's worth again; selective keeps the same lower bound as none (the attention
// core's own saved tensors are not counted). In the activations' dtype: 4 bytes, 2 in bf16.
int64_t ActivationBytes(const TrainerConfig& c, const GptConfig& m, int64_t tokens, int64_t tp) {
  const int64_t C = m.hidden, D = m.hidden / m.num_heads;
  const int64_t block = 4 * C + (m.num_heads + 2 * m.num_kv_heads) * D / tp +
                        (m.is_moe() ? 0 : 3 * m.ffn_hidden / tp);
  const int64_t L = m.num_layers;
  int64_t per_token = L * block;
  if (c.recompute == RecomputeMode::kFull) {
    const int64_t recomputed = c.recompute_layers < 0 ? L : std::min(L, c.recompute_layers);
    per_token = recomputed * C + (L - recomputed) * block + (recomputed > 0 ? block : 0);
  }
  return per_token * tokens * (c.precision == Precision::kBf16 ? 2 : 4);
}

// The parts of MinBytesPerRank, each with what sets it.
std::vector<std::pair<int64_t, std::string>> MemoryTerms(const TrainerConfig& c, int world_size) {
  // Every term is bounded by the validated config (sizes fit int64 with room), so no overflow.
  // The model as the run resolves it (its vocabulary may be the data's); the preset when the data's
  // description cannot be read (the run reports that itself).
  const absl::StatusOr<ResolvedModel> resolved = ResolveModel(c);
  const GptConfig preset = resolved.ok() ? resolved->config : *GptPreset(c.model);
  // With --tp each rank holds 1/tp of the params (the few replicated norms are left out: this is a
  // lower bound) and of the logits' vocabulary, and the batch is split over dp = world / tp.
  const int64_t tp = std::max<int64_t>(1, c.tp);
  const int dp = static_cast<int>(std::max<int64_t>(1, world_size / tp));
  const int64_t params = GptParamCount(preset) / tp;
  const int64_t seq_len = c.seq_len > 0 ? c.seq_len : preset.max_seq_len;
  const int64_t micro_batch = c.global_batch / (int64_t{dp} * c.micro_batches);
  // Optimizer state: AdamW's two fp32 moments, Muon's one fp32 momentum (fp32 params are their own
  // main params). Params and grads are fp32.
  const int64_t muon =
      c.optimizer == OptimizerChoice::kMuon ? GptHiddenMatrixCount(preset) / tp : 0;
  const int64_t state = 8 * (params - muon) + 4 * muon;
  // replicated: every rank holds and steps everything; layerwise/distopt: whole params and grads,
  // its share of the state; fsdp: its share of all three.
  const DistModeSpec& mode = SpecOf(c.dist);
  const int64_t model_bytes = mode.sharded_params ? (8 * params + state) / dp
                              : mode.sharded_step ? 8 * params + state / dp
                                                  : 8 * params + state;
  return {
      {model_bytes,
       absl::StrCat("the model (--model=", c.model, ", ", params,
                    tp > 1 ? absl::StrCat(" params per tp rank at --tp=", tp) : " params",
                    ", --dist=", mode.name,
                    ": ", mode.rank_holds,
                    ")")},
      {2 * micro_batch * seq_len * (preset.vocab_size / tp) * 4,
       absl::StrCat("the logits of a micro-batch of ", micro_batch,
                    " samples (lower --global_batch or raise --micro_batches)")},
      {ActivationBytes(c, preset, micro_batch * seq_len, tp),
       absl::StrCat("the activations of a micro-batch of ", micro_batch, " x ", seq_len,
                    " tokens (--recompute=", ChoiceName(c.recompute),
                    c.recompute == RecomputeMode::kFull
                        ? "; raise --micro_batches or lower --seq_len)"
                        : "; --recompute=full keeps only each block's input)")},
      {c.eval_batches * micro_batch * seq_len * 16,
       absl::StrCat("the eval batches (lower --eval_batches, now ", c.eval_batches, ")")},
      {DatasetSpecResidentBytes(c.data), absl::StrCat("the data (--data=", c.data, ")")},
  };
}

}  // namespace

absl::Status CheckResolvedModel(const TrainerConfig& c) {
  if (c.tp <= 1) return absl::OkStatus();
  const absl::StatusOr<ResolvedModel> resolved = ResolveModel(c);
  if (!resolved.ok()) return absl::OkStatus();
  if (absl::Status s = model::ValidateTensorParallel(resolved->config, static_cast<int>(c.tp));
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", c.tp, " for model '", c.model, "' with the vocabulary of ",
        resolved->vocab_source, ": ", s.message(), "; give a --vocab_size tp divides"));
  }
  return absl::OkStatus();
}

int64_t MinBytesPerRank(const TrainerConfig& c, int world_size) {
  int64_t total = 0;
  for (const auto& [bytes, what] : MemoryTerms(c, world_size)) total += bytes;
  return total;
}

absl::Status CheckMachine(const TrainerConfig& c, int local_ranks, int world_size,
                          const MachineResources& machine) {
  if (c.num_threads > machine.cores) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_threads ", c.num_threads, " exceeds the ", machine.cores,
        " cores this process may use (and ", local_ranks, " rank(s) share them); use at most ",
        std::max(1, machine.cores / std::max(1, local_ranks)), " per rank"));
  }
  if (machine.available_bytes <= 0) return absl::OkStatus();
  const int64_t per_rank = MinBytesPerRank(c, world_size);
  const double need = static_cast<double>(per_rank) * local_ranks;
  if (need <= static_cast<double>(machine.available_bytes)) return absl::OkStatus();
  const std::vector<std::pair<int64_t, std::string>> terms = MemoryTerms(c, world_size);
  std::vector<std::pair<int64_t, std::string>> sorted = terms;
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  return absl::FailedPreconditionError(absl::StrCat(
      "this run needs at least ", GiB(per_rank), " per rank x ", local_ranks, " rank(s) here = ",
      GiB(static_cast<int64_t>(need)), ", but ", GiB(machine.available_bytes),
      " is available; the largest part is ", sorted[0].second, ": ", GiB(sorted[0].first),
      " per rank; the next is ", sorted[1].second, ": ", GiB(sorted[1].first), " per rank"));
}

namespace {

// `dir` (named by `flag_name`) is a directory this process can write in, or can be created under
// its nearest existing ancestor. Errors: kFailedPrecondition naming the flag and the path.
absl::Status CheckWritableDir(absl::string_view flag_name, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string flag = absl::StrCat(flag_name, " '", dir, "'");
  std::error_code ec;
  fs::path existing = fs::absolute(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat(flag, ": ", ec.message()));
  fs::file_status status = fs::status(existing, ec);
  while (status.type() == fs::file_type::not_found && existing.has_relative_path()) {
    existing = existing.parent_path();
    status = fs::status(existing, ec);
  }
  if (status.type() != fs::file_type::directory) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": '", existing.string(), "' is not a directory"));
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, ": cannot write in '", existing.string(), "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLogDir(const TrainerConfig& c) {
  if (!c.log_dir.empty()) RETURN_IF_ERROR(CheckWritableDir("--log_dir", c.log_dir));
  if (c.profile_step_start > 0 && !c.profile_dir.empty()) {
    RETURN_IF_ERROR(CheckWritableDir("--profile_dir", c.profile_dir));
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::integration
