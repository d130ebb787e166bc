// Fuzz target for the checkpoint manifest (checkpoint/manifest.h): the input is the bytes of a
// manifest.binpb. Parsing and ValidateManifest (as ReadManifest does) either fail with a status or
// accept a manifest that re-serializes, re-parses and re-validates identically.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "checkpoint/manifest.h"
#include "checkpoint/manifest.pb.h"

using ::orthoshard::checkpoint::Manifest;
using ::orthoshard::checkpoint::ManifestToText;
using ::orthoshard::checkpoint::ValidateManifest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Manifest manifest;
  if (!manifest.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::Status status = ValidateManifest(manifest, "fuzz input");
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kInvalidArgument &&
        status.code() != absl::StatusCode::kFailedPrecondition) {
      std::abort();
    }
    return 0;
  }
  ManifestToText(manifest);
  std::string bytes;
  if (!manifest.SerializeToString(&bytes)) std::abort();
  Manifest again;
  if (!again.ParseFromString(bytes) || !ValidateManifest(again, "round trip").ok()) std::abort();
  return 0;
}
