#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "checkpoint/internal/json.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {
namespace {

using internal_checkpoint::JsonKindName;
using internal_checkpoint::JsonQuote;
using internal_checkpoint::JsonValue;

constexpr absl::string_view kMetadataKey = "__metadata__";

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::Status FileError(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file ", file, ": ", what));
}

absl::Status TensorError(absl::string_view file, absl::string_view tensor, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors file ", file, ": tensor '", absl::CHexEscape(tensor), "': ", what));
}

// Parses one tensor entry of the header into `entry`.
absl::Status ParseEntry(absl::string_view file, const std::string& name, const JsonValue& value,
                        TensorEntry& entry) {
  entry.spec.name = name;
  if (value.kind != JsonValue::Kind::kObject) {
    return TensorError(file, name, absl::StrCat("entry is a ", JsonKindName(value.kind),
                                                ", expected an object"));
  }
  for (const auto& member : value.members) {
    if (member.first != "dtype" && member.first != "shape" && member.first != "data_offsets") {
      return TensorError(file, name, absl::StrCat("unexpected field \"",
                                                  absl::CHexEscape(member.first), "\""));
    }
  }
  const JsonValue* dtype = value.Find("dtype");
  const JsonValue* shape = value.Find("shape");
  const JsonValue* offsets = value.Find("data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return TensorError(file, name, "entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (dtype->kind != JsonValue::Kind::kString) return TensorError(file, name, "dtype is not a string");
  entry.spec.dtype = dtype->string_value;
  if (!SafetensorsDTypeSize(entry.spec.dtype).ok()) {
    return TensorError(file, name, absl::StrCat("unknown dtype \"", absl::CHexEscape(entry.spec.dtype),
                                                "\" (known: ",
                                                absl::StrJoin(SafetensorsDTypes(), ", "), ")"));
  }
  if (shape->kind != JsonValue::Kind::kArray) return TensorError(file, name, "shape is not an array");
  for (const JsonValue& dim : shape->elements) {
    if (dim.kind != JsonValue::Kind::kInteger || dim.negative ||
        dim.magnitude > static_cast<uint64_t>(INT64_MAX)) {
      return TensorError(file, name, "shape must be an array of non-negative integers");
    }
    entry.spec.shape.push_back(static_cast<int64_t>(dim.magnitude));
  }
  if (offsets->kind != JsonValue::Kind::kArray || offsets->elements.size() != 2 ||
      offsets->elements[0].kind != JsonValue::Kind::kInteger ||
      offsets->elements[1].kind != JsonValue::Kind::kInteger || offsets->elements[0].negative ||
      offsets->elements[1].negative) {
    return TensorError(file, name, "data_offsets must be [begin, end] with non-negative integers");
  }
  entry.begin = offsets->elements[0].magnitude;
  entry.end = offsets->elements[1].magnitude;
  if (entry.end < entry.begin) {
    return TensorError(file, name, absl::StrCat("data_offsets [", entry.begin, ",", entry.end,
                                                "] end before they begin"));
  }
  absl::StatusOr<uint64_t> bytes = TensorByteSize(entry.spec);
  if (!bytes.ok()) return TensorError(file, name, bytes.status().message());
  if (*bytes != entry.end - entry.begin) {
    return TensorError(file, name,
                       absl::StrCat("shape ", ShapeString(entry.spec.shape), " of ", entry.spec.dtype,
                                    " needs ", *bytes, " bytes, data_offsets [", entry.begin, ",",
                                    entry.end, "] give ", entry.end - entry.begin));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& SafetensorsDTypes() {
  static const auto* names = new std::vector<std::string>{
      "BOOL", "U8",  "I8",  "I16", "U16", "F16", "BF16",    "I32",
      "U32",  "F32", "F64", "I64", "U64", "F8_E4M3", "F8_E5M2"};
  return *names;
}

absl::StatusOr<uint64_t> SafetensorsDTypeSize(absl::string_view dtype) {
  static const auto* sizes = new absl::flat_hash_map<std::string, uint64_t>{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes->find(dtype);
  if (it == sizes->end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype \"",
                                                   absl::CHexEscape(dtype), "\" (known: ",
                                                   absl::StrJoin(SafetensorsDTypes(), ", "), ")"));
  }
  return it->second;
}

absl::StatusOr<uint64_t> TensorByteSize(const TensorSpec& spec) {
  ASSIGN_OR_RETURN(uint64_t bytes, SafetensorsDTypeSize(spec.dtype));
  for (int64_t dim : spec.shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(spec.shape), " has a negative dimension"));
    }
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(spec.shape), " of ", spec.dtype,
                       " has more than 2^64 bytes"));
    }
  }
  return bytes;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t data_size,
                                                         absl::string_view file) {
  absl::StatusOr<JsonValue> parsed = internal_checkpoint::ParseJson(json);
  if (!parsed.ok()) return FileError(file, absl::StrCat("header: ", parsed.status().message()));
  if (parsed->kind != JsonValue::Kind::kObject) {
    return FileError(file, absl::StrCat("header is a JSON ", JsonKindName(parsed->kind),
                                        ", expected an object"));
  }
  SafetensorsHeader header;
  for (const auto& [name, value] : parsed->members) {
    if (name == kMetadataKey) {
      if (value.kind != JsonValue::Kind::kObject) {
        return FileError(file, "\"__metadata__\" is not an object");
      }
      for (const auto& [key, v] : value.members) {
        if (v.kind != JsonValue::Kind::kString) {
          return FileError(file, absl::StrCat("\"__metadata__\" value of \"", absl::CHexEscape(key),
                                              "\" is a ", JsonKindName(v.kind),
                                              ", expected a string"));
        }
        header.metadata.emplace_back(key, v.string_value);
      }
      continue;
    }
    TensorEntry entry;
    RETURN_IF_ERROR(ParseEntry(file, name, value, entry));
    header.tensors.push_back(std::move(entry));
  }
  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const TensorEntry& a, const TensorEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t cursor = 0;
  for (const TensorEntry& entry : header.tensors) {
    if (entry.begin < cursor) {
      return TensorError(file, entry.spec.name,
                         absl::StrCat("data_offsets [", entry.begin, ",", entry.end,
                                      "] overlap the previous tensor, which ends at ", cursor));
    }
    if (entry.begin > cursor) {
      return TensorError(file, entry.spec.name,
                         absl::StrCat("data_offsets [", entry.begin, ",", entry.end,
                                      "] leave a gap after byte ", cursor));
    }
    if (entry.end > data_size) {
      return TensorError(file, entry.spec.name,
                         absl::StrCat("truncated: data_offsets [", entry.begin, ",", entry.end,
                                      "] run past the ", data_size, " data bytes in the file"));
    }
    cursor = entry.end;
  }
  if (cursor != data_size) {
    return FileError(file, absl::StrCat("trailing bytes: tensors cover ", cursor,
                                        " data bytes, the file has ", data_size));
  }
  return header;
}

absl::StatusOr<std::string> SerializeSafetensorsHeader(
    const std::vector<TensorSpec>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    absl::StrAppend(&json, JsonQuote(kMetadataKey), ":{");
    for (size_t i = 0; i < metadata.size(); ++i) {
      absl::StrAppend(&json, i ? "," : "", JsonQuote(metadata[i].first), ":",
                      JsonQuote(metadata[i].second));
    }
    json += "}";
    first = false;
  }
  absl::flat_hash_set<std::string> names;
  uint64_t offset = 0;
  for (const TensorSpec& spec : tensors) {
    if (spec.name.empty() || spec.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name \"", spec.name, "\" is empty or reserved"));
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", spec.name, "'"));
    }
    absl::StatusOr<uint64_t> bytes = TensorByteSize(spec);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", spec.name, "': ", bytes.status().message()));
    }
    absl::StrAppend(&json, first ? "" : ",", JsonQuote(spec.name), ":{\"dtype\":",
                    JsonQuote(spec.dtype), ",\"shape\":", ShapeString(spec.shape),
                    ",\"data_offsets\":[", offset, ",", offset + *bytes, "]}");
    first = false;
    offset += *bytes;
  }
  json += "}";
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');
  return json;
}

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  ASSIGN_OR_RETURN(std::string json, SerializeSafetensorsHeader(tensors, metadata));
  SafetensorsWriter writer;
  ASSIGN_OR_RETURN(writer.file_, File::CreateForWrite(path));
  unsigned char length[8];
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  RETURN_IF_ERROR(writer.file_.WriteAll(length, sizeof(length)));
  RETURN_IF_ERROR(writer.file_.WriteAll(json.data(), json.size()));
  uint64_t offset = 8 + n;
  for (const TensorSpec& spec : tensors) {
    WrittenTensor written;
    written.name = spec.name;
    written.offset = offset;
    written.length = *TensorByteSize(spec);  // validated by SerializeSafetensorsHeader
    offset += written.length;
    writer.written_.push_back(std::move(written));
  }
  writer.specs_ = std::move(tensors);
  return writer;
}

absl::Status SafetensorsWriter::Append(absl::Span<const uint8_t> bytes) {
  if (finished_) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors file ", file_.path(),
                                                      ": Append after Finish"));
  }
  while (!bytes.empty() || (current_ < written_.size() &&
                            current_filled_ == written_[current_].length)) {
    if (current_ >= written_.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("safetensors file ", file_.path(), ": ", bytes.size(),
                       " bytes appended after the last tensor"));
    }
    WrittenTensor& tensor = written_[current_];
    uint64_t take = std::min<uint64_t>(bytes.size(), tensor.length - current_filled_);
    if (take > 0) {
      RETURN_IF_ERROR(file_.WriteAll(bytes.data(), take));
      tensor.crc32c = Crc32cExtend(tensor.crc32c, bytes.data(), take);
      current_filled_ += take;
      bytes.remove_prefix(take);
    }
    if (current_filled_ == tensor.length) {
      ++current_;
      current_filled_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WrittenTensor>> SafetensorsWriter::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors file ", file_.path(),
                                                      ": Finish called twice"));
  }
  RETURN_IF_ERROR(Append({}));  // steps past trailing zero-byte tensors
  if (current_ < written_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "safetensors file ", file_.path(), ": tensor '", written_[current_].name, "' has ",
        current_filled_, " of its ", written_[current_].length, " bytes"));
  }
  finished_ = true;
  RETURN_IF_ERROR(file_.Sync());
  RETURN_IF_ERROR(file_.Close());
  return std::move(written_);
}

absl::StatusOr<std::vector<WrittenTensor>> WriteSafetensorsFile(
    const std::string& path, const std::vector<TensorData>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorData& tensor : tensors) {
    absl::StatusOr<uint64_t> bytes = TensorByteSize(tensor.spec);
    if (bytes.ok() && *bytes != tensor.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors file ", path, ": tensor '", tensor.spec.name, "' has shape ",
          ShapeString(tensor.spec.shape), " of ", tensor.spec.dtype, " (", *bytes,
          " bytes) but ", tensor.bytes.size(), " bytes were given"));
    }
    specs.push_back(tensor.spec);
  }
  ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::Create(path, specs, metadata));
  for (const TensorData& tensor : tensors) RETURN_IF_ERROR(writer.Append(tensor.bytes));
  return writer.Finish();
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader reader;
  ASSIGN_OR_RETURN(reader.file_, File::OpenForRead(path));
  ASSIGN_OR_RETURN(reader.file_size_, reader.file_.Size());
  if (reader.file_size_ < 8) {
    return FileError(path, absl::StrCat("truncated: ", reader.file_size_,
                                        " bytes, too short for the 8-byte header length"));
  }
  unsigned char length[8];
  RETURN_IF_ERROR(reader.file_.PreadExact(length, sizeof(length), 0));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > kMaxSafetensorsHeaderBytes) {
    return FileError(path, absl::StrCat("header length ", n, " exceeds the limit of ",
                                        kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > reader.file_size_ - 8) {
    return FileError(path, absl::StrCat("truncated: header length ", n, " but only ",
                                        reader.file_size_ - 8, " bytes follow it"));
  }
  std::string json(n, '\0');
  RETURN_IF_ERROR(reader.file_.PreadExact(json.data(), json.size(), 8));
  reader.data_start_ = 8 + n;
  ASSIGN_OR_RETURN(reader.header_,
                   ParseSafetensorsHeader(json, reader.file_size_ - reader.data_start_, path));
  for (size_t i = 0; i < reader.header_.tensors.size(); ++i) {
    reader.index_.emplace(reader.header_.tensors[i].spec.name, i);
  }
  return reader;
}

const TensorEntry* SafetensorsReader::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::Status SafetensorsReader::ReadTensor(absl::string_view name, absl::Span<uint8_t> out) const {
  const TensorEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("safetensors file ", path(), ": no tensor '", name, "'"));
  }
  if (out.size() != entry->end - entry->begin) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path(), ": tensor '", name,
                                                   "' has ", entry->end - entry->begin,
                                                   " bytes, the buffer ", out.size()));
  }
  return ReadBytes(data_start_ + entry->begin, out);
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsReader::ReadTensor(absl::string_view name) const {
  const TensorEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("safetensors file ", path(), ": no tensor '", name, "'"));
  }
  std::vector<uint8_t> bytes(entry->end - entry->begin);
  RETURN_IF_ERROR(ReadBytes(data_start_ + entry->begin, absl::MakeSpan(bytes)));
  return bytes;
}

absl::Status SafetensorsReader::ReadBytes(uint64_t offset, absl::Span<uint8_t> out) const {
  if (offset > file_size_ || out.size() > file_size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("safetensors file ", path(), ": bytes [", offset, ",",
                                              offset + out.size(), ") past its end at ",
                                              file_size_));
  }
  return file_.PreadExact(out.data(), out.size(), offset);
}

}  // namespace orthoshard::checkpoint
