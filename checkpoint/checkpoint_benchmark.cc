// Throughput of the checkpoint I/O path next to plain POSIX I/O of the same bytes, same run.
//
//   bazel run -c opt //checkpoint:checkpoint_benchmark [-- --benchmark_filter=...]
//
// 256 MiB of tensors (64 × 4 MiB F32) under $TMPDIR (default /tmp). Writes:
//   PlainWrite        write(2) the bytes in 4 MiB calls + fsync          (baseline)
//   SafetensorsWrite  WriteSafetensorsFile: header + CRC-32C per tensor + fsync
//   CheckpointSave    BeginCheckpoint + WriteShard + WriteManifest + CommitCheckpoint
// Reads (page cache warm for all three, as they run back to back on the same files):
//   PlainRead         read(2) the whole file in 4 MiB calls               (baseline)
//   SafetensorsRead   SafetensorsReader::Open + ReadTensor of every tensor by name
//   CheckpointVerify  ReadManifest + VerifyCheckpoint (pread + CRC-32C of every record)
// Checksums alone: BM_Crc32c (dispatched: SSE4.2 where the CPU has it), BM_Crc32cPortable (tables).
// After the table, each is printed as a ratio of bytes/s to its baseline.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "checkpoint/commit.h"
#include "common/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard.h"

namespace orthoshard::checkpoint {
namespace {

constexpr int kTensors = 64;
constexpr size_t kTensorBytes = 4 << 20;
constexpr int64_t kTotalBytes = int64_t{kTensors} * kTensorBytes;

std::string BenchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", "orthoshard_checkpoint_benchmark");
  if (!MakeDir(dir).ok()) std::abort();
  return dir;
}

const std::vector<std::vector<uint8_t>>& Data() {
  static const auto* data = [] {
    auto* d = new std::vector<std::vector<uint8_t>>(kTensors);
    uint64_t x = 88172645463325252ull;
    for (auto& t : *d) {
      t.resize(kTensorBytes);
      for (auto& b : t) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b = static_cast<uint8_t>(x);
      }
    }
    return d;
  }();
  return *data;
}

std::vector<TensorData> Tensors() {
  std::vector<TensorData> tensors;
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back({{absl::StrCat("layers.", i, ".weight"), "F32",
                        {static_cast<int64_t>(kTensorBytes / 4 / 1024), 1024}},
                       Data()[i]});
  }
  return tensors;
}

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
    std::abort();
  }
}

void BM_PlainWrite(benchmark::State& state) {
  const std::string path = JoinPath(BenchDir(), "plain.bin");
  Data();
  for (auto _ : state) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (const auto& t : Data()) {
      if (::write(fd, t.data(), t.size()) != static_cast<ssize_t>(t.size())) std::abort();
    }
    ::fsync(fd);
    ::close(fd);
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_SafetensorsWrite(benchmark::State& state) {
  const std::string path = JoinPath(BenchDir(), "model.safetensors");
  std::vector<TensorData> tensors = Tensors();
  for (auto _ : state) Check(WriteSafetensorsFile(path, tensors).status());
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_CheckpointSave(benchmark::State& state) {
  const std::string root = JoinPath(BenchDir(), "ckpt");
  Check(RemoveRecursively(root));
  std::vector<RecordData> records;
  for (const TensorData& t : Tensors()) {
    records.push_back({t.spec.name, "param", t.spec.dtype, t.spec.shape, t.bytes});
  }
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    absl::StatusOr<std::string> dir = BeginCheckpoint(root, step);
    Check(dir.status());
    absl::StatusOr<std::vector<TensorRecord>> written = WriteShard(*dir, "rank0.safetensors",
                                                                   records);
    Check(written.status());
    Manifest manifest;
    manifest.set_format_version(kManifestFormatVersion);
    manifest.set_step(step);
    manifest.set_dp_size(1);
    for (TensorRecord& r : *written) *manifest.add_tensors() = std::move(r);
    Check(WriteManifest(*dir, manifest));
    CommitOptions options;
    options.keep_last = 1;
    Check(CommitCheckpoint(root, step, options));
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_PlainRead(benchmark::State& state) {
  const std::string path = JoinPath(BenchDir(), "plain.bin");
  std::vector<uint8_t> buffer(kTensorBytes);
  for (auto _ : state) {
    int fd = ::open(path.c_str(), O_RDONLY);
    int64_t total = 0;
    ssize_t n;
    while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) total += n;
    ::close(fd);
    if (total != kTotalBytes) std::abort();
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_SafetensorsRead(benchmark::State& state) {
  const std::string path = JoinPath(BenchDir(), "model.safetensors");
  std::vector<uint8_t> buffer(kTensorBytes);
  for (auto _ : state) {
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    Check(reader.status());
    for (const TensorEntry& entry : reader->header().tensors) {
      Check(reader->ReadTensor(entry.spec.name, absl::MakeSpan(buffer)));
    }
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_CheckpointVerify(benchmark::State& state) {
  const std::string root = JoinPath(BenchDir(), "ckpt");
  for (auto _ : state) {
    absl::StatusOr<std::string> dir = ResolveLatest(root);
    Check(dir.status());
    absl::StatusOr<Manifest> manifest = ReadManifest(*dir);
    Check(manifest.status());
    if (!VerifyCheckpoint(*dir, *manifest).empty()) std::abort();
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_Crc32c(benchmark::State& state) {
  uint32_t crc = 0;
  for (auto _ : state) {
    for (const auto& t : Data()) crc = Crc32cExtend(crc, t.data(), t.size());
  }
  benchmark::DoNotOptimize(crc);
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_Crc32cPortable(benchmark::State& state) {
  uint32_t crc = 0;
  for (auto _ : state) {
    for (const auto& t : Data()) crc = Crc32cExtendPortable(crc, t.data(), t.size());
  }
  benchmark::DoNotOptimize(crc);
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

BENCHMARK(BM_PlainWrite)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_SafetensorsWrite)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_CheckpointSave)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_PlainRead)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(10);
BENCHMARK(BM_SafetensorsRead)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(10);
BENCHMARK(BM_CheckpointVerify)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(10);
BENCHMARK(BM_Crc32c)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(10);
BENCHMARK(BM_Crc32cPortable)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(10);

// Prints the table as usual and remembers bytes/s per benchmark for the ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      const std::string name = run.benchmark_name();
      rates_[name.substr(0, name.find('/'))] = it->second.value;
    }
  }
  void PrintRatios() const {
    auto ratio = [&](const char* name, const char* baseline) {
      auto a = rates_.find(name);
      auto b = rates_.find(baseline);
      if (a == rates_.end() || b == rates_.end() || b->second == 0) return;
      std::printf("%-20s %8.1f MB/s = %.2f x %s (%.1f MB/s)\n", name, a->second / 1e6,
                  a->second / b->second, baseline, b->second / 1e6);
    };
    ratio("BM_SafetensorsWrite", "BM_PlainWrite");
    ratio("BM_CheckpointSave", "BM_PlainWrite");
    ratio("BM_SafetensorsRead", "BM_PlainRead");
    ratio("BM_CheckpointVerify", "BM_PlainRead");
    ratio("BM_Crc32c", "BM_PlainRead");
    ratio("BM_Crc32cPortable", "BM_PlainRead");
  }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace
}  // namespace orthoshard::checkpoint

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  orthoshard::checkpoint::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
