// Training-step throughput of the GPT presets on CPU, against a dense-matmul baseline of the same
// FLOP count measured in the same run: `ratio_vs_matmul` = step time / baseline time, i.e. how far
// the model's small ops, attention and autograd overhead keep it from the machine's GEMM speed.
//   bazel run -c opt //model:model_benchmark
// Single-threaded ATen (at::set_num_threads(1)) throughout.
#include <malloc.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/arange.h>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "model/model.h"

namespace orthoshard::model {

using ::orthoshard::data::TokenDataset;
using ::orthoshard::data::SyntheticCorpus;
using ::orthoshard::data::MakeSyntheticCorpus;
using ::orthoshard::data::LoaderOptions;
using ::orthoshard::data::DataLoader;
namespace {

// Forward + backward FLOPs: 6 per matmul weight per token (Kaplan et al. 2020, sec. 2.1) plus the
// attention score and value products, 12 * L * T * C per token (causal halves it; not counted).
double StepFlops(const GptConfig& c, int64_t tokens, int64_t seq_len) {
  double weights = 0;
  const int64_t D = c.hidden / c.num_heads;
  weights += static_cast<double>((c.num_heads + 2 * c.num_kv_heads) * D) * c.hidden;  // qkv
  weights += static_cast<double>(c.hidden) * c.hidden;                                // proj
  weights += 3.0 * c.ffn_hidden * c.hidden;                                           // fc1, fc2
  weights = weights * c.num_layers + static_cast<double>(c.vocab_size) * c.hidden;    // + head
  return 6.0 * weights * tokens + 12.0 * c.num_layers * seq_len * c.hidden * tokens;
}

// Seconds per [M, K] x [K, N] product with 2*M*K*N ~= flops / 3 (three GEMMs per weight).
double MatmulBaselineSeconds(double flops) {
  at::set_num_threads(1);
  const int64_t m = 1024, k = 256;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(flops / 3.0 / (2.0 * m * k)));
  const at::Tensor a = at::randn({m, k}), b = at::randn({k, n});
  at::mm(a, b);  // warm up
  const int reps = 5;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) benchmark::DoNotOptimize(at::mm(a, b).data_ptr());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  return 3.0 * seconds;
}

// One intra-op thread, as each rank of a 2-rank run on 2 cores gets.
void BM_TrainStep(benchmark::State& state, const char* preset, int64_t batch) {
  at::set_num_threads(1);
  GptConfig config = GptPreset(preset).value();
  Gpt model = Gpt::Create(config, 1).value();
  const int64_t T = config.max_seq_len;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const at::Tensor tokens =
      at::randint(config.vocab_size, {batch, T}, gen, at::TensorOptions().dtype(at::kLong));
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    at::Tensor loss = model.Loss(tokens, tokens).value();
    loss.backward();
    for (const ModelParam& p : model.params()) p.tensor.mutable_grad().reset();
  }
  const double step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  const double flops = StepFlops(config, batch * T, T);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(batch * T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gflops_per_s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ratio_vs_matmul"] = step_seconds / MatmulBaselineSeconds(flops);
}

// This thread's CPU seconds: unlike wall time, not stretched while other processes hold the core.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// QK-clip's measurement (--qk_clip_threshold): a train step without and with the max-logit record
// (Gpt::set_max_logit_record: one more no-grad q k^T per block), alternated within one loop so that
// load drift on a shared machine hits both alike, in thread CPU time. step_ms_off / step_ms_on per
// step, overhead = on / off - 1.
void BM_QkClipRecord(benchmark::State& state, const char* preset, int64_t batch) {
  at::set_num_threads(1);
  GptConfig config = GptPreset(preset).value();
  Gpt model = Gpt::Create(config, 1).value();
  const int64_t T = config.max_seq_len;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const at::Tensor tokens =
      at::randint(config.vocab_size, {batch, T}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor record = at::full({config.num_layers, config.num_heads}, -INFINITY);
  double seconds[2] = {0, 0};
  for (auto _ : state) {
    for (const int on : {0, 1}) {
      model.set_max_logit_record(on ? record : at::Tensor());
      const double start = ThreadCpuSeconds();
      at::Tensor loss = model.Loss(tokens, tokens).value();
      loss.backward();
      for (const ModelParam& p : model.params()) p.tensor.mutable_grad().reset();
      seconds[on] += ThreadCpuSeconds() - start;
    }
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["step_ms_off"] = 1e3 * seconds[0] / steps;
  state.counters["step_ms_on"] = 1e3 * seconds[1] / steps;
  state.counters["overhead"] = seconds[1] / seconds[0] - 1.0;
}

void BM_LoaderStep(benchmark::State& state) {
  SyntheticCorpus corpus = MakeSyntheticCorpus({1, 1 << 20}).value();
  auto data = std::make_shared<TokenDataset>(std::move(corpus.data));
  LoaderOptions options;
  options.seq_len = 1024;
  options.micro_batch_size = 8;
  options.micro_batches = 4;
  DataLoader loader = DataLoader::Create(data, options).value();
  for (auto _ : state) benchmark::DoNotOptimize(loader.Next().data());
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(options.seq_len * options.micro_batch_size * options.micro_batches),
      benchmark::Counter::kIsIterationInvariantRate);
}

// kB of one "Vm...:" line of /proc/self/status (0 when absent).
int64_t StatusKb(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  return 0;
}

// Document attention (Documents::attention) segments vs mask: forward + backward of one batch
// whose rows hold documents of `doc_len` tokens (each row's cut shifted, so rows differ), in thread
// CPU time, and the step's peak RSS above the RSS before it (VmHWM after resetting it through
// /proc/self/clear_refs). Large blocks are mmapped and returned at free (fixed malloc thresholds),
// so the peak is the step's live tensors. A 2-layer model of the preset's width, heads and MLP,
// vocabulary 256: the attention under test is per layer, and the head would dominate otherwise.
void BM_DocumentAttention(benchmark::State& state, const char* preset, int64_t T, int64_t batch,
                          int64_t doc_len, DocumentAttention how) {
  at::set_num_threads(1);
  mallopt(M_MMAP_THRESHOLD, 1 << 17);
  mallopt(M_TRIM_THRESHOLD, 1 << 17);
  GptConfig config = GptPreset(preset).value();
  config.num_layers = 2;
  config.vocab_size = 256;
  config.max_seq_len = T;
  Gpt model = Gpt::Create(config, 1).value();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong);
  const at::Tensor tokens = at::randint(config.vocab_size, {batch, T}, gen, longs);
  // Row b's documents start at (b * 7) mod doc_len and every doc_len tokens after.
  const at::Tensor t = at::arange(T, longs).unsqueeze(0), shift = (at::arange(batch, longs) * 7)
                                                                     .remainder(doc_len)
                                                                     .unsqueeze(1);
  const at::Tensor since = t + (doc_len - shift);  // tokens since a virtual start before the row
  Documents documents{since.div(doc_len, "floor") - (doc_len - shift).div(doc_len, "floor"),
                      at::Tensor(), how};
  documents.segments = documents.segments - documents.segments.select(1, 0).unsqueeze(1);
  documents.positions = at::minimum(since.remainder(doc_len), t);
  double seconds = 0;
  int64_t peak_kb = 0;
  for (auto _ : state) {
    std::ofstream("/proc/self/clear_refs") << "5";
    const int64_t before = StatusKb("VmRSS:");
    const double start = ThreadCpuSeconds();
    at::Tensor loss = model.Loss(tokens, tokens, &documents).value();
    loss.backward();
    seconds += ThreadCpuSeconds() - start;
    peak_kb = std::max(peak_kb, StatusKb("VmHWM:") - before);
    for (const ModelParam& p : model.params()) p.tensor.mutable_grad().reset();
  }
  state.counters["step_ms"] = 1e3 * seconds / static_cast<double>(state.iterations());
  state.counters["peak_mb"] = static_cast<double>(peak_kb) / 1024.0;
}

[[maybe_unused]] const bool kDocumentAttentionRegistered = [] {
  struct Shape {
    const char* preset;
    int64_t batch;
  };
  for (const Shape shape : {Shape{"small", 4}, Shape{"gpt2-124m", 1}}) {
    for (const int64_t T : {512, 2048}) {
      for (const int64_t parts : {4, 32}) {
        for (const DocumentAttention how : {DocumentAttention::kSegments, DocumentAttention::kMask}) {
          const std::string name =
              absl::StrCat("BM_DocumentAttention/", shape.preset, "/T", T, "/doc", T / parts, "/",
                           how == DocumentAttention::kMask ? "mask" : "segments");
          benchmark::RegisterBenchmark(name.c_str(), BM_DocumentAttention, shape.preset, T,
                                       shape.batch, T / parts, how)
              ->Iterations(3)
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  return true;
}();

BENCHMARK_CAPTURE(BM_TrainStep, tiny, "tiny", 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, small, "small", 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LoaderStep)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_QkClipRecord, tiny, "tiny", 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_QkClipRecord, small, "small", 4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace orthoshard::model
