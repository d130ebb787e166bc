// The commands of the `ckpt` tool, as a library: argument parsing, inspect, verify, export.
//
//   ckpt inspect DIR      prints the manifest of a checkpoint
//   ckpt verify DIR       checks every tensor's CRC-32C against the shard files
//   ckpt export DIR --to=OUT [--max_shard_bytes=N] [--format=safetensors|hf] [--tokenizer=PATH]
//                         writes the params as OUT/model.safetensors, or as Hugging Face shards
//                         OUT/model-00001-of-0000K.safetensors + OUT/model.safetensors.index.json;
//                         --format=hf renames and splits them for a model library (the mapping
//                         comes from the caller: integration/hf_export.h for orthoshard's GPT)
//   ckpt forward DIR --tokens=IDS [--out=FILE]
//                         (a caller's command: integration/ckpt_main.cc) logits and loss of ids
// DIR is a checkpoint directory (holding manifest.binpb) or a root holding a `latest` pointer.
#ifndef ORTHOSHARD_CHECKPOINT_TOOL_CKPT_COMMANDS_H_
#define ORTHOSHARD_CHECKPOINT_TOOL_CKPT_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.pb.h"

namespace orthoshard::checkpoint {

// Usage text of the tool.
extern const char kCkptUsage[];

// Hugging Face's default shard limit: 5 GB.
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

struct CkptCommand {
  enum class Verb { kInspect, kVerify, kExport, kForward };
  Verb verb = Verb::kInspect;
  std::string dir;                                 // checkpoint directory or root
  std::string to;                                  // export: output directory
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;  // export: bytes of tensor data per shard
  std::string format = "safetensors";              // export: safetensors (names as saved) or hf
  std::string tokenizer;                           // export --format=hf: tokenizer file or dir
  std::string tokens;                              // forward: comma-separated ids, or @FILE
  std::string out;                                 // forward: logits file (safetensors)
};

// Parses the arguments after the program name. Errors: kInvalidArgument with a message saying what
// is wrong (unknown command, missing DIR or --to, unknown flag, bad number, extra arguments).
absl::StatusOr<CkptCommand> ParseCkptArgs(const std::vector<std::string>& args);

// One tensor of a mapped export: rows of a checkpoint param under a new name. The rows are the
// concatenation of `rows` ranges (start, count) along dimension 0, in order; empty: the whole
// param. Its shape is the param's with dimension 0 = the rows' total.
struct ExportTensor {
  std::string name;    // in the export
  std::string source;  // param name in the checkpoint
  std::vector<std::pair<int64_t, int64_t>> rows;
};

// How an export renames and splits the params, and the files it writes beside them.
struct ExportMapping {
  std::vector<ExportTensor> tensors;         // in export order; every param must be a source
  std::map<std::string, std::string> files;  // file name -> contents (config.json, tokenizer, ...)
};

struct ExportOptions {
  // A shard closes before a tensor that would take it past this many data bytes; a tensor larger
  // than the limit gets a shard of its own. Must be > 0.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Absent: every param under its own name.
  std::optional<ExportMapping> mapping;
};

// What a program adds to the commands above (ckpt export --format=hf, ckpt forward): it knows the
// model, this package does not. hf_mapping gets the checkpoint's manifest (its model_config is
// the saving run's SharedState::model_config, to be checked against the params the manifest lists
// before it is trusted) and the resolved checkpoint directory; it runs before anything is written.
struct CkptExtensions {
  std::function<absl::StatusOr<ExportMapping>(const Manifest& manifest,
                                              const std::string& checkpoint_dir,
                                              const CkptCommand& command)>
      hf_mapping;
  std::function<absl::Status(const std::string& checkpoint_dir, const CkptCommand& command,
                             std::ostream& out)>
      forward;
};

// Runs `command`, printing its report to `out`. Errors: those of ResolveCheckpointDir and
// ReadManifest; verify: kDataLoss "N of M tensors failed verification" (each failure, naming file
// and tensor, is printed to `out` first); export: those of ExportSafetensors; kUnimplemented for
// --format=hf or forward without the extension that provides it.
absl::Status RunCkptCommand(const CkptCommand& command, std::ostream& out,
                            const CkptExtensions& extensions = {});

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
// With a mapping, the tensors are the mapping's (each source CRC-checked as it is read) and its
// files are written too, inside the same all-or-nothing replacement; the files a previous mapped
// export wrote count as an export's.
// Errors: kInvalidArgument for max_shard_bytes == 0 or a manifest without params; for a mapping
// naming a param the checkpoint lacks, leaving a param out, or rows outside the param;
// kFailedPrecondition naming a file in `out_dir` that no export writes (nothing is touched); those
// of ReadManifest, ReadRecord (kDataLoss naming file and tensor) and I/O (`out_dir` unchanged).
absl::StatusOr<std::vector<std::string>> ExportSafetensors(const std::string& checkpoint_dir,
                                                           const std::string& out_dir,
                                                           const ExportOptions& options = {});

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_TOOL_CKPT_COMMANDS_H_
