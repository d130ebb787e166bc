#include "checkpoint/tool/ckpt_commands.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "checkpoint/internal/json.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard.h"
#include "checkpoint/tp_slices.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {

const char kCkptUsage[] =
    "usage: ckpt inspect DIR\n"
    "       ckpt verify DIR\n"
    "       ckpt export DIR --to=OUT [--max_shard_bytes=N] [--format=safetensors|hf]\n"
    "                   [--tokenizer=PATH]   (hf: a prepared data dir or a tokenizer.json)\n"
    "       ckpt forward DIR --tokens=ID,ID,...|@FILE [--out=LOGITS.safetensors]\n"
    "DIR is a checkpoint directory (with manifest.binpb) or a root with a `latest` pointer.";

namespace {

absl::Status ArgError(absl::string_view what) { return absl::InvalidArgumentError(what); }

constexpr char kIndexName[] = "model.safetensors.index.json";

// Whether `name` is a file ExportSafetensors writes (with `mapping`'s files).
bool IsExportFile(absl::string_view name, const std::optional<ExportMapping>& mapping) {
  return name == "model.safetensors" || name == kIndexName ||
         (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors")) ||
         (mapping.has_value() && mapping->files.count(std::string(name)) > 0);
}

// kFailedPrecondition if `dir` exists and holds anything an export does not write.
absl::Status CheckReplaceable(const std::string& dir, const std::optional<ExportMapping>& mapping) {
  ASSIGN_OR_RETURN(const bool exists, PathExists(dir));
  if (!exists) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool is_dir, IsDirectory(dir));
  if (!is_dir) {
    return absl::FailedPreconditionError(
        absl::StrCat("export --to=", dir, ": exists and is not a directory"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  for (const std::string& name : names) {
    if (!IsExportFile(name, mapping)) {
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
  ASSIGN_OR_RETURN(const std::vector<WholeParam> params, WholeParams(manifest, dir));
  const int tp = std::max(1, manifest.tp_size());
  out << "params (whole shapes), saved at tp " << tp << " x dp " << manifest.dp_size() << ":\n";
  for (const WholeParam& p : params) {
    out << "  " << p.name << ": " << p.dtype << " [" << absl::StrJoin(p.shape, ",") << "], ";
    if (p.split.split()) {
      out << "tp " << p.split.size << ": dim " << p.split.dim << ", " << p.split.parts
          << (p.split.parts == 1 ? " part" : " parts") << "\n";
    } else {
      out << (tp > 1 ? "replicated" : "whole") << "\n";
    }
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
  } else if (args[0] == "forward") {
    command.verb = CkptCommand::Verb::kForward;
  } else {
    return ArgError(absl::StrCat("unknown command '", args[0],
                                 "' (expected inspect, verify, export or forward)"));
  }
  bool have_to = false;
  for (size_t i = 1; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (absl::StartsWith(arg, "--") && command.verb == CkptCommand::Verb::kForward) {
      if (absl::ConsumePrefix(&arg, "--tokens=")) {
        if (arg.empty()) return ArgError("--tokens= needs ids (ID,ID,...) or @FILE");
        command.tokens = std::string(arg);
      } else if (absl::ConsumePrefix(&arg, "--out=")) {
        if (arg.empty()) return ArgError("--out= needs a file name");
        command.out = std::string(arg);
      } else {
        return ArgError(absl::StrCat("unknown flag '", arg, "' for forward"));
      }
      continue;
    }
    if (absl::StartsWith(arg, "--")) {
      if (command.verb != CkptCommand::Verb::kExport) {
        return ArgError(absl::StrCat("unknown flag '", arg, "' for ", args[0]));
      }
      if (absl::ConsumePrefix(&arg, "--format=")) {
        if (arg != "safetensors" && arg != "hf") {
          return ArgError(absl::StrCat("--format must be safetensors or hf, got '", arg, "'"));
        }
        command.format = std::string(arg);
      } else if (absl::ConsumePrefix(&arg, "--tokenizer=")) {
        if (arg.empty()) return ArgError("--tokenizer= needs a path");
        command.tokenizer = std::string(arg);
      } else if (absl::ConsumePrefix(&arg, "--to=")) {
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
  if (command.verb == CkptCommand::Verb::kExport && !command.tokenizer.empty() &&
      command.format != "hf") {
    return ArgError("--tokenizer is for --format=hf");
  }
  if (command.verb == CkptCommand::Verb::kForward && command.tokens.empty()) {
    return ArgError("forward needs --tokens=ID,ID,... or --tokens=@FILE");
  }
  return command;
}

absl::Status RunCkptCommand(const CkptCommand& command, std::ostream& out,
                            const CkptExtensions& extensions) {
  ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(command.dir));
  switch (command.verb) {
    case CkptCommand::Verb::kInspect:
      return Inspect(dir, out);
    case CkptCommand::Verb::kVerify:
      return Verify(dir, out);
    case CkptCommand::Verb::kForward:
      if (!extensions.forward) {
        return absl::UnimplementedError("this program has no model to run `forward` with");
      }
      return extensions.forward(dir, command, out);
    case CkptCommand::Verb::kExport: {
      ExportOptions options;
      options.max_shard_bytes = command.max_shard_bytes;
      if (command.format == "hf") {
        if (!extensions.hf_mapping) {
          return absl::UnimplementedError(
              "this program knows no model to map to Hugging Face names (--format=hf)");
        }
        ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir));
        ASSIGN_OR_RETURN(options.mapping, extensions.hf_mapping(manifest, dir, command));
      }
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
                  [](const TensorRecord& record) { return IsParamKind(record.kind()); });
  if (!has_params) {
    return ArgError(absl::StrCat("checkpoint ", checkpoint_dir, " has no records of kind \"",
                                 kParamKind, "\" to export"));
  }
  RETURN_IF_ERROR(CheckReplaceable(out_dir, options.mapping));
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

// A tensor of the export: its name, dtype and shape, and where its bytes come from.
struct Planned {
  std::string name;
  const WholeParam* source = nullptr;
  std::vector<std::pair<int64_t, int64_t>> rows;  // empty: the whole record
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// `whole`: the checkpoint's params (WholeParams), whole or from tp slices.
absl::StatusOr<std::vector<Planned>> PlanExport(const std::vector<WholeParam>& whole,
                                                const std::optional<ExportMapping>& mapping) {
  std::map<std::string, const WholeParam*> params;
  std::vector<Planned> planned;
  for (const WholeParam& param : whole) {
    params[param.name] = &param;
    if (!mapping.has_value()) {
      planned.push_back({param.name, &param, {}, param.shape, param.bytes});
    }
  }
  if (!mapping.has_value()) return planned;
  std::set<std::string> used;
  for (const ExportTensor& t : mapping->tensors) {
    const auto it = params.find(t.source);
    if (it == params.end()) {
      return ArgError(absl::StrCat("export mapping: '", t.name, "' comes from param '", t.source,
                                   "', which the checkpoint does not have"));
    }
    const WholeParam& record = *it->second;
    used.insert(t.source);
    std::vector<int64_t> shape = record.shape;
    if (t.rows.empty()) {  // renamed whole (scalars included)
      planned.push_back({t.name, &record, {}, shape, record.bytes});
      continue;
    }
    if (shape.empty()) {
      return ArgError(absl::StrCat("export mapping: '", t.name, "' takes rows of param '", t.source,
                                   "', a scalar"));
    }
    const int64_t rows = shape[0];
    int64_t total = 0;
    for (const auto& [start, count] : t.rows) {
      if (start < 0 || count < 1 || start > rows - count) {
        return ArgError(absl::StrCat("export mapping: '", t.name, "' takes rows [", start, ", ",
                                     start + count, ") of '", t.source, "', which has ", rows));
      }
      total += count;
    }
    const uint64_t row_bytes = rows > 0 ? record.bytes / static_cast<uint64_t>(rows) : 0;
    shape[0] = total;
    planned.push_back({t.name, &record, t.rows, shape, row_bytes * static_cast<uint64_t>(total)});
  }
  for (const auto& [name, record] : params) {
    if (used.count(name) == 0) {
      return ArgError(absl::StrCat("export mapping leaves out param '", name,
                                   "' (an export must carry every weight)"));
    }
  }
  return planned;
}

absl::StatusOr<std::vector<std::string>> WriteExportFiles(const std::string& checkpoint_dir,
                                                          const Manifest& manifest,
                                                          const std::string& out_dir,
                                                          const ExportOptions& options) {
  ASSIGN_OR_RETURN(const std::vector<WholeParam> whole, WholeParams(manifest, checkpoint_dir));
  ASSIGN_OR_RETURN(const std::vector<Planned> params, PlanExport(whole, options.mapping));
  // Greedy packing in export order.
  std::vector<std::vector<const Planned*>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const Planned& p : params) {
    const Planned* record = &p;
    if (!shards.back().empty() && shard_bytes + record->bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(record);
    shard_bytes += record->bytes;
    total_bytes += record->bytes;
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) {
    names.push_back(shards.size() == 1
                        ? std::string("model.safetensors")
                        : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size()));
  }
  std::map<std::string, SafetensorsReader> readers;
  std::vector<uint8_t> buffer, rows;
  const WholeParam* buffered = nullptr;  // whose bytes `buffer` holds (fused params feed several)
  // Reads one record, CRC-checked, opening its shard file once.
  auto read = [&](const TensorRecord& record, absl::Span<uint8_t> out) -> absl::Status {
    auto it = readers.find(record.file());
    if (it == readers.end()) {
      ASSIGN_OR_RETURN(SafetensorsReader reader,
                       SafetensorsReader::Open(JoinPath(checkpoint_dir, record.file())));
      it = readers.emplace(record.file(), std::move(reader)).first;
    }
    return ReadRecord(it->second, record, out);
  };
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<TensorSpec> specs;
    for (const Planned* p : shards[i]) specs.push_back({p->name, p->source->dtype, p->shape});
    ASSIGN_OR_RETURN(SafetensorsWriter writer,
                     SafetensorsWriter::Create(JoinPath(out_dir, names[i]), std::move(specs),
                                               {{"format", "pt"}}));
    for (const Planned* p : shards[i]) {
      const WholeParam* record = p->source;
      if (buffered != record) {
        buffer.resize(record->bytes);
        RETURN_IF_ERROR(ReadWholeParam(*record, read, absl::MakeSpan(buffer)));
        buffered = record;
      }
      if (p->rows.empty()) {
        RETURN_IF_ERROR(writer.Append(buffer));
        continue;
      }
      const uint64_t row_bytes = record->bytes / static_cast<uint64_t>(record->shape[0]);
      rows.clear();
      for (const auto& [start, count] : p->rows) {
        rows.insert(rows.end(), buffer.begin() + start * row_bytes,
                    buffer.begin() + (start + count) * row_bytes);
      }
      RETURN_IF_ERROR(writer.Append(rows));
    }
    RETURN_IF_ERROR(writer.Finish().status());
  }
  if (options.mapping.has_value()) {
    for (const auto& [file, contents] : options.mapping->files) {
      RETURN_IF_ERROR(WriteFileAtomically(JoinPath(out_dir, file), contents));
      names.push_back(file);
    }
  }
  RETURN_IF_ERROR(SyncDir(out_dir));
  if (shards.size() == 1) return names;
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    for (const Planned* p : shards[i]) weight_map[p->name] = names[i];
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
