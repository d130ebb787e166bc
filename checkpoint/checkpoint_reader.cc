#include "checkpoint/checkpoint_reader.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& path) {
  CheckpointReader reader;
  ASSIGN_OR_RETURN(reader.dir_, ResolveCheckpointDir(path));
  ASSIGN_OR_RETURN(reader.manifest_, ReadManifest(reader.dir_));
  std::map<std::string, std::vector<int>> records_by_file;
  for (int i = 0; i < reader.manifest_.tensors_size(); ++i) {
    const TensorRecord& record = reader.manifest_.tensors(i);
    records_by_file[record.file()].push_back(i);
    reader.index_.emplace(std::make_pair(record.name(), record.kind()), i);
  }
  for (const auto& [file, records] : records_by_file) {
    const std::string file_path = JoinPath(reader.dir_, file);
    absl::StatusOr<SafetensorsReader> shard = SafetensorsReader::Open(file_path);
    if (!shard.ok()) {
      const TensorRecord& first = reader.manifest_.tensors(records.front());
      return absl::DataLossError(absl::StrCat("checkpoint file ", file_path, " (holding tensor '",
                                              first.name(), "' (", first.kind(), ") and ",
                                              records.size() - 1, " more): ",
                                              shard.status().message()));
    }
    for (int i : records) {
      RETURN_IF_ERROR(CheckRecordAgainstHeader(*shard, reader.manifest_.tensors(i)));
    }
    reader.files_.emplace(file, *std::move(shard));
  }
  ASSIGN_OR_RETURN(reader.params_, WholeParams(reader.manifest_, reader.dir_));
  for (int i = 0; i < static_cast<int>(reader.params_.size()); ++i) {
    reader.param_index_.emplace(reader.params_[i].name, i);
  }
  return reader;
}

const WholeParam* CheckpointReader::FindParam(absl::string_view name) const {
  auto it = param_index_.find(name);
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

const TensorRecord* CheckpointReader::Find(absl::string_view name, absl::string_view kind) const {
  auto it = index_.find(std::make_pair(std::string(name), std::string(kind)));
  return it == index_.end() ? nullptr : &manifest_.tensors(it->second);
}

std::vector<const TensorRecord*> CheckpointReader::RecordsOf(absl::string_view name) const {
  std::vector<const TensorRecord*> records;
  for (const TensorRecord& record : manifest_.tensors()) {
    if (record.name() == name) records.push_back(&record);
  }
  return records;
}

absl::Status CheckpointReader::Read(absl::string_view name, absl::string_view kind,
                                    absl::string_view expected_dtype,
                                    absl::Span<const int64_t> expected_shape,
                                    absl::Span<uint8_t> out) const {
  const TensorRecord* record = Find(name, kind);
  const WholeParam* sliced = kind == kParamKind && record == nullptr ? FindParam(name) : nullptr;
  if (sliced != nullptr) {
    if (sliced->dtype != expected_dtype ||
        absl::Span<const int64_t>(sliced->shape) != expected_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir_, ": param '", name, "' (whole, from its tp slices) is ",
          sliced->dtype, " [", absl::StrJoin(sliced->shape, ","), "], the model expects ",
          expected_dtype, " [", absl::StrJoin(expected_shape, ","), "]"));
    }
    return ReadWholeParam(
        *sliced,
        [this](const TensorRecord& r, absl::Span<uint8_t> bytes) {
          return ReadRecord(files_.at(r.file()), r, bytes);
        },
        out);
  }
  if (record == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, ": no record '", name, "' (", kind, ")"));
  }
  const absl::Span<const int64_t> shape(record->global_shape().data(),
                                        record->global_shape().size());
  if (record->dtype() != expected_dtype || shape != expected_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint file ", JoinPath(dir_, record->file()), ": tensor '", name, "' (", kind,
        ") is ", record->dtype(), " [", absl::StrJoin(shape, ","), "], the model expects ",
        expected_dtype, " [", absl::StrJoin(expected_shape, ","), "]"));
  }
  return ReadRecord(files_.at(record->file()), *record, out);
}

}  // namespace orthoshard::checkpoint
