// Reading, writing and validating the checkpoint manifest (manifest.proto).
//
// The manifest is stored as a binary protobuf, `manifest.binpb`, in the checkpoint directory:
// binary because it round-trips every field exactly (text format would too, but binary is what
// protobuf guarantees to stay compatible as fields are added) and because `ckpt inspect` prints it
// as text for people. It is written atomically (temp file + fsync + rename + directory fsync).
//
// The file is the serialized Manifest followed by an 8-byte trailer: the CRC-32C of the serialized
// bytes (u32 little-endian) and the magic "OSM1". Protobuf parses many corrupted byte strings into
// a valid-looking message (a flipped bit in `step` is another step), so every read checks the CRC
// first: any single-bit flip, and any burst of up to 32 bits, anywhere in the file is rejected.
#ifndef ORTHOSHARD_CHECKPOINT_MANIFEST_H_
#define ORTHOSHARD_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.pb.h"

namespace orthoshard::checkpoint {

// The manifest schema version this build writes and reads.
inline constexpr uint32_t kManifestFormatVersion = 1;
// File name of the manifest inside a checkpoint directory.
inline constexpr char kManifestFileName[] = "manifest.binpb";
// TensorRecord.kind of a model parameter (other kinds are optimizer state keys).
inline constexpr char kParamKind[] = "param";

// Name of a record's tensor inside its shard file: `name` for a param, `name#kind` otherwise
// (so one file can hold a param and all its optimizer state).
std::string RecordFileKey(absl::string_view name, absl::string_view kind);

// Checks a manifest; `source` names it in errors. Errors:
//   kFailedPrecondition: format_version is not kManifestFormatVersion ("format version 7 is not
//     supported; this build reads version 1").
//   kInvalidArgument: dp_size < 1; a record with an empty name/kind/file_key, a file name that is
//     empty or contains '/', an unknown dtype, a negative dimension, a length that is not
//     shape × dtype size; a (name, kind) pair or a (file, file_key) pair listed twice.
absl::Status ValidateManifest(const Manifest& manifest, absl::string_view source);

// Validates `manifest` and writes it to `dir`/manifest.binpb atomically. Errors: those of
// ValidateManifest; OS errors naming the path.
absl::Status WriteManifest(const std::string& dir, const Manifest& manifest);

// Reads and validates `dir`/manifest.binpb. Errors: kNotFound naming the path if it is missing;
// kDataLoss if the trailer is missing or its CRC does not match, or it does not parse; those of
// ValidateManifest.
absl::StatusOr<Manifest> ReadManifest(const std::string& dir);

// The file contents for `manifest` (serialization + trailer), and the inverse: checks the trailer
// and CRC, parses and validates; `source` names the file in errors (as ReadManifest's).
absl::StatusOr<std::string> EncodeManifestFile(const Manifest& manifest, absl::string_view source);
absl::StatusOr<Manifest> DecodeManifestFile(absl::string_view bytes, absl::string_view source);

// Protobuf text format of `manifest`, for people.
std::string ManifestToText(const Manifest& manifest);

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_MANIFEST_H_
