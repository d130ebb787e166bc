#include "checkpoint/manifest.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"

namespace orthoshard::checkpoint {
namespace {

absl::Status RecordError(absl::string_view source, const TensorRecord& record,
                         absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("manifest ", source, ": tensor '", record.name(),
                                                 "' (", record.kind(), "): ", what));
}

}  // namespace

std::string RecordFileKey(absl::string_view name, absl::string_view kind) {
  if (kind == kParamKind) return std::string(name);
  return absl::StrCat(name, "#", kind);
}

absl::Status ValidateManifest(const Manifest& manifest, absl::string_view source) {
  if (manifest.format_version() != kManifestFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("manifest ", source, ": format version ", manifest.format_version(),
                     " is not supported; this build reads version ", kManifestFormatVersion));
  }
  if (manifest.dp_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", source, ": dp_size is ", manifest.dp_size(), ", expected >= 1"));
  }
  absl::flat_hash_set<std::pair<std::string, std::string>> names;
  absl::flat_hash_set<std::pair<std::string, std::string>> keys;
  for (const TensorRecord& record : manifest.tensors()) {
    if (record.name().empty() || record.kind().empty() || record.file_key().empty()) {
      return RecordError(source, record, "name, kind and file_key must be non-empty");
    }
    if (record.file().empty() || record.file().find('/') != std::string::npos ||
        record.file() == "." || record.file() == "..") {
      return RecordError(source, record,
                         absl::StrCat("file \"", record.file(), "\" is not a plain file name"));
    }
    TensorSpec spec{record.file_key(), record.dtype(),
                    {record.global_shape().begin(), record.global_shape().end()}};
    absl::StatusOr<uint64_t> bytes = TensorByteSize(spec);
    if (!bytes.ok()) return RecordError(source, record, bytes.status().message());
    if (*bytes != record.length()) {
      return RecordError(source, record,
                         absl::StrCat("length is ", record.length(), " bytes, shape and dtype ",
                                      record.dtype(), " need ", *bytes));
    }
    if (!names.emplace(record.name(), record.kind()).second) {
      return RecordError(source, record, "listed twice");
    }
    if (!keys.emplace(record.file(), record.file_key()).second) {
      return RecordError(source, record,
                         absl::StrCat("file_key '", record.file_key(), "' of file ", record.file(),
                                      " is used by another record"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteManifest(const std::string& dir, const Manifest& manifest) {
  const std::string path = JoinPath(dir, kManifestFileName);
  RETURN_IF_ERROR(ValidateManifest(manifest, path));
  std::string bytes;
  if (!manifest.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat("manifest ", path, ": serialization failed"));
  }
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestFileName);
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  Manifest manifest;
  if (!manifest.ParseFromString(bytes)) {
    return absl::DataLossError(
        absl::StrCat("manifest ", path, ": not a valid Manifest protobuf (", bytes.size(), " bytes)"));
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, path));
  return manifest;
}

std::string ManifestToText(const Manifest& manifest) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  return text;
}

}  // namespace orthoshard::checkpoint
