#include "checkpoint/shard.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {
namespace {

constexpr uint64_t kVerifyChunkBytes = 16 << 20;

absl::Status RecordDataLoss(const std::string& path, const TensorRecord& record,
                            absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": tensor '", record.name(),
                                          "' (", record.kind(), "): ", what));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace

absl::StatusOr<std::vector<TensorRecord>> WriteShard(const std::string& dir, const std::string& file,
                                                     const std::vector<RecordData>& records) {
  if (file.empty() || file.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard file name \"", file, "\" is not a plain file name"));
  }
  std::vector<TensorData> tensors;
  tensors.reserve(records.size());
  for (const RecordData& record : records) {
    tensors.push_back(
        {{RecordFileKey(record.name, record.kind), record.dtype, record.shape}, record.bytes});
  }
  ASSIGN_OR_RETURN(std::vector<WrittenTensor> written,
                   WriteSafetensorsFile(JoinPath(dir, file), tensors));
  std::vector<TensorRecord> out;
  out.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    TensorRecord record;
    record.set_name(records[i].name);
    record.set_kind(records[i].kind);
    for (int64_t dim : records[i].shape) record.add_global_shape(dim);
    record.set_dtype(records[i].dtype);
    record.set_file(file);
    record.set_file_key(written[i].name);
    record.set_offset(written[i].offset);
    record.set_length(written[i].length);
    record.set_crc32c(written[i].crc32c);
    if (records[i].tp.has_value()) *record.mutable_tp() = *records[i].tp;
    out.push_back(std::move(record));
  }
  return out;
}

absl::Status CheckRecordAgainstHeader(const SafetensorsReader& reader, const TensorRecord& record) {
  const TensorEntry* entry = reader.Find(record.file_key());
  if (entry == nullptr) {
    return RecordDataLoss(reader.path(), record,
                          absl::StrCat("no tensor '", record.file_key(), "' in the file"));
  }
  std::vector<int64_t> shape(record.global_shape().begin(), record.global_shape().end());
  if (entry->spec.dtype != record.dtype() || entry->spec.shape != shape) {
    return RecordDataLoss(reader.path(), record,
                          absl::StrCat("file has ", entry->spec.dtype, " ",
                                       ShapeString(entry->spec.shape), ", manifest says ",
                                       record.dtype(), " ", ShapeString(shape)));
  }
  const uint64_t offset = reader.data_start() + entry->begin;
  if (offset != record.offset() || entry->end - entry->begin != record.length()) {
    return RecordDataLoss(reader.path(), record,
                          absl::StrCat("file has bytes [", offset, ",", offset + entry->end -
                                       entry->begin, "), manifest says [", record.offset(), ",",
                                       record.offset() + record.length(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadRecord(const SafetensorsReader& reader, const TensorRecord& record,
                        absl::Span<uint8_t> out) {
  RETURN_IF_ERROR(CheckRecordAgainstHeader(reader, record));
  if (out.size() != record.length()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", reader.path(), ": tensor '",
                                                   record.name(), "' (", record.kind(), ") has ",
                                                   record.length(), " bytes, the buffer ",
                                                   out.size()));
  }
  RETURN_IF_ERROR(reader.ReadBytes(record.offset(), out));
  const uint32_t crc = Crc32c(out.data(), out.size());
  if (crc != record.crc32c()) {
    return RecordDataLoss(reader.path(), record,
                          absl::StrFormat("crc32c 0x%08x does not match the manifest's 0x%08x", crc,
                                          record.crc32c()));
  }
  return absl::OkStatus();
}

std::vector<absl::Status> VerifyCheckpoint(const std::string& dir, const Manifest& manifest) {
  std::vector<absl::Status> failures;
  std::map<std::string, absl::StatusOr<SafetensorsReader>> readers;
  std::vector<uint8_t> chunk;
  for (const TensorRecord& record : manifest.tensors()) {
    auto it = readers.find(record.file());
    if (it == readers.end()) {
      it = readers.emplace(record.file(), SafetensorsReader::Open(JoinPath(dir, record.file())))
               .first;
    }
    if (!it->second.ok()) {
      failures.push_back(RecordDataLoss(JoinPath(dir, record.file()), record,
                                        it->second.status().message()));
      continue;
    }
    const SafetensorsReader& reader = *it->second;
    if (absl::Status s = CheckRecordAgainstHeader(reader, record); !s.ok()) {
      failures.push_back(std::move(s));
      continue;
    }
    uint32_t crc = 0;
    absl::Status read_status;
    for (uint64_t done = 0; done < record.length() && read_status.ok();) {
      const uint64_t take = std::min(kVerifyChunkBytes, record.length() - done);
      chunk.resize(take);
      read_status = reader.ReadBytes(record.offset() + done, absl::MakeSpan(chunk));
      crc = Crc32cExtend(crc, chunk.data(), take);
      done += take;
    }
    if (!read_status.ok()) {
      failures.push_back(RecordDataLoss(reader.path(), record, read_status.message()));
    } else if (crc != record.crc32c()) {
      failures.push_back(RecordDataLoss(
          reader.path(), record,
          absl::StrFormat("crc32c 0x%08x does not match the manifest's 0x%08x", crc,
                          record.crc32c())));
    }
  }
  return failures;
}

}  // namespace orthoshard::checkpoint
