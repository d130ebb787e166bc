// The commands of the `ckpt` tool, as a library: argument parsing, inspect, verify, export.
//
//   ckpt inspect DIR      prints the manifest of a checkpoint
//   ckpt verify DIR       checks every tensor's CRC-32C against the shard files
//   ckpt export DIR --to=OUT [--max_shard_bytes=N]
//                         writes the params as OUT/model.safetensors, or as Hugging Face shards
//                         OUT/model-00001-of-0000K.safetensors + OUT/model.safetensors.index.json
// DIR is a checkpoint directory (holding manifest.binpb) or a root holding a `latest` pointer.
#ifndef ORTHOSHARD_CHECKPOINT_CKPT_COMMANDS_H_
#define ORTHOSHARD_CHECKPOINT_CKPT_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace orthoshard::checkpoint {

// Usage text of the tool.
extern const char kCkptUsage[];

// Hugging Face's default shard limit: 5 GB.
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

struct CkptCommand {
  enum class Verb { kInspect, kVerify, kExport };
  Verb verb = Verb::kInspect;
  std::string dir;                                 // checkpoint directory or root
  std::string to;                                  // export: output directory
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;  // export: bytes of tensor data per shard
};

// Parses the arguments after the program name. Errors: kInvalidArgument with a message saying what
// is wrong (unknown command, missing DIR or --to, unknown flag, bad number, extra arguments).
absl::StatusOr<CkptCommand> ParseCkptArgs(const std::vector<std::string>& args);

// Runs `command`, printing its report to `out`. Errors: those of ResolveCheckpointDir and
// ReadManifest; verify: kDataLoss "N of M tensors failed verification" (each failure, naming file
// and tensor, is printed to `out` first); export: those of ExportSafetensors.
absl::Status RunCkptCommand(const CkptCommand& command, std::ostream& out);

struct ExportOptions {
  // A shard closes before a tensor that would take it past this many data bytes; a tensor larger
  // than the limit gets a shard of its own. Must be > 0.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
};

// Writes every record of kind "param" of the checkpoint in `checkpoint_dir` (CRC-checked while
// read) to `out_dir` as safetensors with metadata {"format": "pt"}; one file `model.safetensors` if
// all fit in one shard, else `model-0000i-of-0000K.safetensors` plus `model.safetensors.index.json`
// = {"metadata": {"total_size": bytes}, "weight_map": {name: file}}. Returns the file names
// written.
//
// All or nothing: the files are written and fsynced in a sibling staging directory
// `out_dir`.export-tmp, which then replaces `out_dir` by two renames (a previous export is moved to
// `out_dir`.export-old first and removed last), so `out_dir` holds either the previous export
// whole or this one whole, never a truncated file, shards without their index or the files of two
// exports side by side. A crash in between leaves the previous export in .export-old, which the
// next export cleans up. `out_dir` must be missing, empty, or hold only files an export writes.
// Errors: kInvalidArgument for max_shard_bytes == 0 or a manifest without params;
// kFailedPrecondition naming a file in `out_dir` that no export writes (nothing is touched); those
// of ReadManifest, ReadRecord (kDataLoss naming file and tensor) and I/O (`out_dir` unchanged).
absl::StatusOr<std::vector<std::string>> ExportSafetensors(const std::string& checkpoint_dir,
                                                           const std::string& out_dir,
                                                           const ExportOptions& options = {});

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_CKPT_COMMANDS_H_
