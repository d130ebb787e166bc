// Shard files of a checkpoint: writing per-parameter records into one safetensors file, reading a
// record back with its checksum checked, and verifying a whole checkpoint against its manifest.
//
// A shard is an ordinary safetensors file whose tensors are named by RecordFileKey(name, kind); the
// manifest's TensorRecords say which file, offset and length hold each (name, kind) and its CRC-32C.
#ifndef ORTHOSHARD_CHECKPOINT_SHARD_H_
#define ORTHOSHARD_CHECKPOINT_SHARD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/manifest.pb.h"
#include "checkpoint/safetensors.h"

namespace orthoshard::checkpoint {

// One record to save: a param (kind == kParamKind) or one optimizer state of a param.
struct RecordData {
  std::string name;                 // model-space parameter name
  std::string kind;                 // kParamKind or an optimizer state key ("exp_avg", ...)
  std::string dtype;                // safetensors dtype name
  std::vector<int64_t> shape;       // shape of the stored tensor (TensorRecord.global_shape)
  absl::Span<const uint8_t> bytes;  // little-endian C-order data, shape × dtype size bytes
  std::optional<TpSlice> tp;        // set for a tensor-parallel slice (TensorRecord.tp)
};

// Writes `records` as the safetensors file `dir`/`file` (fsynced) and returns their manifest
// records (offsets, lengths, CRC-32C). Errors: kInvalidArgument for a bad file name, a duplicate
// (name, kind), or bytes that do not match shape × dtype; those of SafetensorsWriter.
absl::StatusOr<std::vector<TensorRecord>> WriteShard(const std::string& dir, const std::string& file,
                                                     const std::vector<RecordData>& records);

// Checks that `reader`'s header agrees with `record` (key present, dtype, shape, offset, length).
// Errors: kDataLoss "checkpoint file <path>: tensor '<name>' (<kind>): ..." naming what differs.
absl::Status CheckRecordAgainstHeader(const SafetensorsReader& reader, const TensorRecord& record);

// Reads `record` from `reader` into `out` (exactly record.length() bytes) and checks its CRC-32C.
// Errors: those of CheckRecordAgainstHeader; kInvalidArgument for a wrong `out` size; kDataLoss
// "checkpoint file <path>: tensor '<name>' (<kind>): crc32c 0x... does not match the manifest's
// 0x..." for corrupted data.
absl::Status ReadRecord(const SafetensorsReader& reader, const TensorRecord& record,
                        absl::Span<uint8_t> out);

// Checks every record of `manifest` against the shard files in `dir` (header agreement and CRC-32C,
// reading in bounded chunks). Returns one error per failing record (empty when all pass), each
// naming the file and tensor; a shard file that is missing or unreadable fails all its records.
// Errors (of the call itself): none besides allocation; I/O problems are per-record results.
std::vector<absl::Status> VerifyCheckpoint(const std::string& dir, const Manifest& manifest);

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_SHARD_H_
