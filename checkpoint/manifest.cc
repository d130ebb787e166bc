#include "checkpoint/manifest.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"

namespace orthoshard::checkpoint {
namespace {

// The file trailer: CRC-32C of the serialized manifest (u32 little-endian), then this magic.
constexpr char kTrailerMagic[] = "OSM1";
constexpr size_t kTrailerSize = 8;

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

absl::StatusOr<std::string> EncodeManifestFile(const Manifest& manifest,
                                               absl::string_view source) {
  RETURN_IF_ERROR(ValidateManifest(manifest, source));
  std::string bytes;
  if (!manifest.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat("manifest ", source, ": serialization failed"));
  }
  const uint32_t crc = Crc32c(bytes.data(), bytes.size());
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  bytes.append(kTrailerMagic, 4);
  return bytes;
}

absl::StatusOr<Manifest> DecodeManifestFile(absl::string_view bytes, absl::string_view source) {
  if (bytes.size() < kTrailerSize ||
      bytes.substr(bytes.size() - 4) != absl::string_view(kTrailerMagic, 4)) {
    return absl::DataLossError(absl::StrCat(
        "manifest ", source, ": no checksum trailer (the file is truncated or corrupt, or was "
        "written by an orthoshard without manifest checksums)"));
  }
  const absl::string_view payload = bytes.substr(0, bytes.size() - kTrailerSize);
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[payload.size() + i])) << (8 * i);
  }
  const uint32_t actual = Crc32c(payload.data(), payload.size());
  if (stored != actual) {
    return absl::DataLossError(absl::StrFormat(
        "manifest %s: CRC-32C mismatch (stored %08x, computed %08x over %d bytes): corrupt", source,
        stored, actual, payload.size()));
  }
  Manifest manifest;
  if (!manifest.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(absl::StrCat("manifest ", source, ": not a valid Manifest protobuf (",
                                            payload.size(), " bytes)"));
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, source));
  return manifest;
}

absl::Status WriteManifest(const std::string& dir, const Manifest& manifest) {
  const std::string path = JoinPath(dir, kManifestFileName);
  ASSIGN_OR_RETURN(const std::string bytes, EncodeManifestFile(manifest, path));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestFileName);
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return DecodeManifestFile(bytes, path);
}

std::string ManifestToText(const Manifest& manifest) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  return text;
}

}  // namespace orthoshard::checkpoint
