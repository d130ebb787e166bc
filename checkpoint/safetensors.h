// Reader and writer of the safetensors file format (https://github.com/huggingface/safetensors).
//
// Layout: u64 little-endian header length N; N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
//    "data_offsets": [begin, end]}, ...}
// with offsets relative to the first data byte, covering the data contiguously with no gaps or
// overlap; then raw little-endian C-order tensor data, nothing after the last tensor.
//
// This layer knows bytes, dtype names and shapes only (no LibTorch), so it compiles fast and its
// header parser can be fuzzed. The writer streams tensor bytes to the file, computes a CRC-32C per
// tensor on the way and fsyncs at the end; the reader validates the whole header on open and reads
// any tensor by name with pread (the file is never loaded whole).
#ifndef ORTHOSHARD_CHECKPOINT_SAFETENSORS_H_
#define ORTHOSHARD_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/file_util.h"

namespace orthoshard::checkpoint {

// Largest header a reader accepts, as in the reference implementation.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The dtype names of the format: BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
// F8_E4M3, F8_E5M2.
const std::vector<std::string>& SafetensorsDTypes();

// Bytes per element of a dtype name. Errors: kInvalidArgument naming the dtype and the list.
absl::StatusOr<uint64_t> SafetensorsDTypeSize(absl::string_view dtype);

// Name, dtype and shape of one tensor.
struct TensorSpec {
  std::string name;
  std::string dtype;             // one of SafetensorsDTypes()
  std::vector<int64_t> shape;    // [] for a scalar
};

// Bytes of a tensor: product of the shape times the element size. Errors: kInvalidArgument for an
// unknown dtype, a negative dimension or a size that overflows 64 bits.
absl::StatusOr<uint64_t> TensorByteSize(const TensorSpec& spec);

// A tensor as listed in a parsed header.
struct TensorEntry {
  TensorSpec spec;
  uint64_t begin = 0;  // data_offsets[0], relative to the data start
  uint64_t end = 0;    // data_offsets[1]
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // sorted by data offset
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", document order
};

// Parses and validates a header. `data_size` is the number of bytes after the header; `file` names
// the file in errors. Errors (all kInvalidArgument, "safetensors file <file>: ..."): malformed JSON,
// a non-object top level or entry, missing/extra/mistyped fields, unknown dtype, negative or huge
// dimensions, offsets with end < begin, a byte count that does not match shape × dtype ("tensor 'x':
// shape [2,3] of F32 needs 24 bytes, data_offsets [0,20] give 20"), overlapping or gapped offsets,
// duplicate names, metadata values that are not strings, data past the end of the file ("truncated")
// and bytes after the last tensor ("trailing bytes").
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t data_size,
                                                         absl::string_view file);

// Serializes the header for `tensors` laid out back to back in the given order, padded with spaces
// so that the data starts at a multiple of 8 bytes from the file start. Errors: kInvalidArgument
// for an empty, duplicate or reserved ("__metadata__") name, an unknown dtype or a negative dim.
absl::StatusOr<std::string> SerializeSafetensorsHeader(
    const std::vector<TensorSpec>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);

// Where a written tensor landed, and its checksum.
struct WrittenTensor {
  std::string name;
  uint64_t offset = 0;  // absolute byte offset in the file
  uint64_t length = 0;  // bytes
  uint32_t crc32c = 0;  // CRC-32C of the tensor's bytes
};

// Streams tensors into a new safetensors file. Usage:
//   ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(path, specs, metadata));
//   for each spec in order: one or more Append(bytes) calls adding up to its byte size;
//   ASSIGN_OR_RETURN(std::vector<WrittenTensor> written, writer.Finish());
// The header is written by Create; Finish checks every byte was supplied, fsyncs and closes. A
// writer dropped before Finish leaves an incomplete file (the commit protocol's `.tmp` directory is
// what keeps that harmless). Not thread-safe.
class SafetensorsWriter {
 public:
  // Errors: those of SerializeSafetensorsHeader; OS errors (kNotFound, kPermissionDenied, ...).
  static absl::StatusOr<SafetensorsWriter> Create(
      const std::string& path, std::vector<TensorSpec> tensors,
      const std::vector<std::pair<std::string, std::string>>& metadata = {});

  // Appends bytes of the current tensor (advancing to the next when one is complete).
  // Errors: kFailedPrecondition if the bytes run past the last tensor or Finish was called;
  // OS errors from write(2).
  absl::Status Append(absl::Span<const uint8_t> bytes);

  // Errors: kFailedPrecondition naming the first tensor whose bytes are missing; OS errors.
  absl::StatusOr<std::vector<WrittenTensor>> Finish();

 private:
  SafetensorsWriter() = default;
  File file_;
  std::vector<TensorSpec> specs_;
  std::vector<WrittenTensor> written_;  // one per spec; offsets known up front
  size_t current_ = 0;                  // index of the tensor being appended
  uint64_t current_filled_ = 0;         // bytes of it written so far
  bool finished_ = false;
};

// A tensor's spec and bytes, for the one-call writer.
struct TensorData {
  TensorSpec spec;
  absl::Span<const uint8_t> bytes;  // exactly TensorByteSize(spec) bytes, little-endian C order
};

// Writes `tensors` to `path` in order. Errors: kInvalidArgument if a tensor's byte count does not
// match its spec (naming it); everything SafetensorsWriter reports.
absl::StatusOr<std::vector<WrittenTensor>> WriteSafetensorsFile(
    const std::string& path, const std::vector<TensorData>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata = {});

// Reads a safetensors file: the header on Open, tensor bytes on demand with pread. Move-only; const
// methods may be called from several threads at once.
class SafetensorsReader {
 public:
  // Opens and validates `path`. Errors: OS errors (kNotFound for a missing file); kInvalidArgument
  // for a file shorter than 8 bytes, a header over kMaxSafetensorsHeaderBytes, a header running past
  // the end of the file ("truncated"), and everything ParseSafetensorsHeader rejects.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  // Absolute file offset of the first data byte (8 + header length).
  uint64_t data_start() const { return data_start_; }

  // The entry named `name`, or nullptr.
  const TensorEntry* Find(absl::string_view name) const;

  // Reads tensor `name` into `out`, which must hold exactly its byte size. Errors: kNotFound naming
  // the file and tensor; kInvalidArgument for a wrong `out` size; kDataLoss if the file shrank.
  absl::Status ReadTensor(absl::string_view name, absl::Span<uint8_t> out) const;
  absl::StatusOr<std::vector<uint8_t>> ReadTensor(absl::string_view name) const;

  // Reads `out.size()` bytes at absolute file offset `offset`. Errors: kOutOfRange past the end.
  absl::Status ReadBytes(uint64_t offset, absl::Span<uint8_t> out) const;

 private:
  SafetensorsReader() = default;
  File file_;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  SafetensorsHeader header_;
  absl::flat_hash_map<std::string, size_t> index_;  // name → position in header_.tensors
};

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_SAFETENSORS_H_
