#include "checkpoint/ckpt_commands.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "checkpoint/internal/json.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {

const char kCkptUsage[] =
    "usage: ckpt inspect DIR\n"
    "       ckpt verify DIR\n"
    "       ckpt export DIR --to=OUT [--max_shard_bytes=N]\n"
    "DIR is a checkpoint directory (with manifest.binpb) or a root with a `latest` pointer.";

namespace {

absl::Status ArgError(absl::string_view what) { return absl::InvalidArgumentError(what); }

constexpr char kIndexName[] = "model.safetensors.index.json";

// Whether `name` is a file ExportSafetensors writes.
bool IsExportFile(absl::string_view name) {
  return name == "model.safetensors" || name == kIndexName ||
         (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"));
}

// kFailedPrecondition if `dir` exists and holds anything an export does not write.
absl::Status CheckReplaceable(const std::string& dir) {
  ASSIGN_OR_RETURN(const bool exists, PathExists(dir));
  if (!exists) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool is_dir, IsDirectory(dir));
  if (!is_dir) {
    return absl::FailedPreconditionError(
        absl::StrCat("export --to=", dir, ": exists and is not a directory"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  for (const std::string& name : names) {
    if (!IsExportFile(name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export --to=", dir, ": holds '", name, "', which no export writes; refusing to replace "
          "the directory (choose an empty or new one)"));
    }
  }
  return absl::OkStatus();
}

// The parent directory of `path` ("." for a bare name), for the fsync after renames.
std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// Writes the export's files into `dir` (which exists and is empty); returns their names.
absl::StatusOr<std::vector<std::string>> WriteExportFiles(const std::string& checkpoint_dir,
                                                          const Manifest& manifest,
                                                          const std::string& dir,
                                                          const ExportOptions& options);

absl::Status Inspect(const std::string& dir, std::ostream& out) {
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir));
  std::map<std::string, std::pair<int, uint64_t>> files;  // file → (tensors, bytes)
  for (const TensorRecord& record : manifest.tensors()) {
    files[record.file()].first += 1;
    files[record.file()].second += record.length();
  }
  out << "checkpoint " << dir << ": step " << manifest.step() << ", " << manifest.tensors_size()
      << " tensors in " << files.size() << " files\n";
  for (const auto& [file, counts] : files) {
    out << "  " << file << ": " << counts.first << " tensors, " << counts.second << " bytes\n";
  }
  out << ManifestToText(manifest);
  return absl::OkStatus();
}

absl::Status Verify(const std::string& dir, std::ostream& out) {
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir));
  std::vector<absl::Status> failures = VerifyCheckpoint(dir, manifest);
  for (const absl::Status& failure : failures) out << "FAILED: " << failure.message() << "\n";
  std::set<std::string> files;
  for (const TensorRecord& record : manifest.tensors()) files.insert(record.file());
  if (!failures.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": ", failures.size(), " of ",
                                            manifest.tensors_size(),
                                            " tensors failed verification"));
  }
  out << "checkpoint " << dir << ": all " << manifest.tensors_size() << " tensors in "
      << files.size() << " files verified\n";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CkptCommand> ParseCkptArgs(const std::vector<std::string>& args) {
  if (args.empty()) return ArgError("missing command (inspect, verify or export)");
  CkptCommand command;
  if (args[0] == "inspect") {
    command.verb = CkptCommand::Verb::kInspect;
  } else if (args[0] == "verify") {
    command.verb = CkptCommand::Verb::kVerify;
  } else if (args[0] == "export") {
    command.verb = CkptCommand::Verb::kExport;
  } else {
    return ArgError(absl::StrCat("unknown command '", args[0],
                                 "' (expected inspect, verify or export)"));
  }
  bool have_to = false;
  for (size_t i = 1; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (absl::StartsWith(arg, "--")) {
      if (command.verb != CkptCommand::Verb::kExport) {
        return ArgError(absl::StrCat("unknown flag '", arg, "' for ", args[0]));
      }
      if (absl::ConsumePrefix(&arg, "--to=")) {
        if (arg.empty()) return ArgError("--to= needs an output directory");
        command.to = std::string(arg);
        have_to = true;
      } else if (absl::ConsumePrefix(&arg, "--max_shard_bytes=")) {
        if (!absl::SimpleAtoi(arg, &command.max_shard_bytes) || command.max_shard_bytes == 0) {
          return ArgError(absl::StrCat("--max_shard_bytes must be a positive integer, got '", arg,
                                       "'"));
        }
      } else {
        return ArgError(absl::StrCat("unknown flag '", arg, "' for export"));
      }
      continue;
    }
    if (!command.dir.empty()) return ArgError(absl::StrCat("unexpected extra argument '", arg, "'"));
    command.dir = std::string(arg);
  }
  if (command.dir.empty()) return ArgError(absl::StrCat(args[0], " needs a checkpoint DIR"));
  if (command.verb == CkptCommand::Verb::kExport && !have_to) {
    return ArgError("export needs --to=OUT");
  }
  return command;
}

absl::Status RunCkptCommand(const CkptCommand& command, std::ostream& out) {
  ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(command.dir));
  switch (command.verb) {
    case CkptCommand::Verb::kInspect:
      return Inspect(dir, out);
    case CkptCommand::Verb::kVerify:
      return Verify(dir, out);
    case CkptCommand::Verb::kExport: {
      ExportOptions options;
      options.max_shard_bytes = command.max_shard_bytes;
      ASSIGN_OR_RETURN(std::vector<std::string> files,
                       ExportSafetensors(dir, command.to, options));
      for (const std::string& file : files) out << "wrote " << JoinPath(command.to, file) << "\n";
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unhandled ckpt command");
}

absl::StatusOr<std::vector<std::string>> ExportSafetensors(const std::string& checkpoint_dir,
                                                           const std::string& out_dir,
                                                           const ExportOptions& options) {
  if (options.max_shard_bytes == 0) return ArgError("max_shard_bytes must be > 0");
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(checkpoint_dir));
  const bool has_params =
      std::any_of(manifest.tensors().begin(), manifest.tensors().end(),
                  [](const TensorRecord& record) { return record.kind() == kParamKind; });
  if (!has_params) {
    return ArgError(absl::StrCat("checkpoint ", checkpoint_dir, " has no records of kind \"",
                                 kParamKind, "\" to export"));
  }
  RETURN_IF_ERROR(CheckReplaceable(out_dir));
  std::string base = out_dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string staging = base + ".export-tmp", old = base + ".export-old";
  RETURN_IF_ERROR(RemoveRecursively(staging));  // a crashed export's
  RETURN_IF_ERROR(MakeDir(staging));
  absl::StatusOr<std::vector<std::string>> names =
      WriteExportFiles(checkpoint_dir, manifest, staging, options);
  if (!names.ok()) {
    RemoveRecursively(staging).IgnoreError();  // best effort; out_dir is untouched either way
    return names.status();
  }
  RETURN_IF_ERROR(SyncDir(staging));
  ASSIGN_OR_RETURN(const bool replace, PathExists(base));
  if (replace) {
    ASSIGN_OR_RETURN(const bool old_exists, PathExists(old));
    // A crash after the previous export moved aside but before the new one moved in left the
    // previous export in .export-old; base is then missing, so replace is false there.
    if (old_exists) RETURN_IF_ERROR(RemoveRecursively(old));
    RETURN_IF_ERROR(Rename(base, old));
  }
  RETURN_IF_ERROR(Rename(staging, base));
  RETURN_IF_ERROR(SyncDir(ParentDir(base)));
  RETURN_IF_ERROR(RemoveRecursively(old));
  return names;
}

namespace {

absl::StatusOr<std::vector<std::string>> WriteExportFiles(const std::string& checkpoint_dir,
                                                          const Manifest& manifest,
                                                          const std::string& out_dir,
                                                          const ExportOptions& options) {
  std::vector<const TensorRecord*> params;
  for (const TensorRecord& record : manifest.tensors()) {
    if (record.kind() == kParamKind) params.push_back(&record);
  }
  // Greedy packing in manifest order.
  std::vector<std::vector<const TensorRecord*>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const TensorRecord* record : params) {
    if (!shards.back().empty() && shard_bytes + record->length() > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(record);
    shard_bytes += record->length();
    total_bytes += record->length();
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) {
    names.push_back(shards.size() == 1
                        ? std::string("model.safetensors")
                        : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size()));
  }
  std::map<std::string, SafetensorsReader> readers;
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<TensorSpec> specs;
    for (const TensorRecord* record : shards[i]) {
      specs.push_back({record->name(), record->dtype(),
                       {record->global_shape().begin(), record->global_shape().end()}});
    }
    ASSIGN_OR_RETURN(SafetensorsWriter writer,
                     SafetensorsWriter::Create(JoinPath(out_dir, names[i]), std::move(specs),
                                               {{"format", "pt"}}));
    for (const TensorRecord* record : shards[i]) {
      auto it = readers.find(record->file());
      if (it == readers.end()) {
        ASSIGN_OR_RETURN(SafetensorsReader reader,
                         SafetensorsReader::Open(JoinPath(checkpoint_dir, record->file())));
        it = readers.emplace(record->file(), std::move(reader)).first;
      }
      buffer.resize(record->length());
      RETURN_IF_ERROR(ReadRecord(it->second, *record, absl::MakeSpan(buffer)));
      RETURN_IF_ERROR(writer.Append(buffer));
    }
    RETURN_IF_ERROR(writer.Finish().status());
  }
  RETURN_IF_ERROR(SyncDir(out_dir));
  if (shards.size() == 1) return names;
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    for (const TensorRecord* record : shards[i]) weight_map[record->name()] = names[i];
  }
  std::string index = absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total_bytes,
                                   "},\n  \"weight_map\": {");
  bool first = true;
  for (const auto& [name, file] : weight_map) {
    absl::StrAppend(&index, first ? "\n    " : ",\n    ", internal_checkpoint::JsonQuote(name), ": ",
                    internal_checkpoint::JsonQuote(file));
    first = false;
  }
  index += "\n  }\n}\n";
  RETURN_IF_ERROR(WriteFileAtomically(JoinPath(out_dir, kIndexName), index));
  names.push_back(kIndexName);
  return names;
}

}  // namespace

}  // namespace orthoshard::checkpoint
