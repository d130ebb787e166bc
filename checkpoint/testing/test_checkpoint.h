// Test helpers: per-test scratch directories and real checkpoints written through the production
// path (BeginCheckpoint → WriteShard per rank → WriteManifest → CommitCheckpoint), the way the
// trainer will write them.
#ifndef ORTHOSHARD_CHECKPOINT_TESTING_TEST_CHECKPOINT_H_
#define ORTHOSHARD_CHECKPOINT_TESTING_TEST_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/commit.h"
#include "checkpoint/manifest.pb.h"

namespace orthoshard::checkpoint::testing {

// A fresh, empty directory under $TEST_TMPDIR named after the running test (plus `suffix`).
std::string ScratchDir(const std::string& suffix = "");

// `count` deterministic pseudo-random bytes from `seed`.
std::vector<uint8_t> DeterministicBytes(uint64_t seed, size_t count);

// One tensor of the synthetic model: its records' bytes derive from (name, kind) deterministically.
struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// A small model of mixed dtypes and shapes (embedding, 2-D weights, norms, a scalar).
std::vector<TestTensor> SmallModel();

// Bytes of record (name, kind) of `tensor` at `step` (0 or 1 per element for BOOL).
std::vector<uint8_t> RecordBytes(const TestTensor& tensor, const std::string& kind, int64_t step);

struct TestCheckpointOptions {
  int dp_size = 2;                                   // one shard file per rank
  std::vector<std::string> optimizer_kinds = {"exp_avg", "exp_avg_sq"};
  CommitOptions commit;
};

// Writes and commits checkpoint `step` of `model` under `root`: rank r owns every tensor i with
// i % dp_size == r and writes its param and optimizer records to rank<r>.safetensors.
absl::Status WriteTestCheckpoint(const std::string& root, int64_t step,
                                 const std::vector<TestTensor>& model,
                                 const TestCheckpointOptions& options = {});

// The manifest.binpb bytes of `manifest` (serialization + CRC trailer) without validating it, as a
// build with another format version would write them.
std::string UnvalidatedManifestFile(const Manifest& manifest);

// Writes shards and manifest of a checkpoint into `dir` without committing (the body of
// WriteTestCheckpoint). Returns the manifest written.
absl::StatusOr<Manifest> WriteTestCheckpointFiles(const std::string& dir, int64_t step,
                                                  const std::vector<TestTensor>& model,
                                                  const TestCheckpointOptions& options = {});

}  // namespace orthoshard::checkpoint::testing

#endif  // ORTHOSHARD_CHECKPOINT_TESTING_TEST_CHECKPOINT_H_
