// Fuzz target for the checkpoint manifest (checkpoint/manifest.h). The input is taken two ways: as
// a whole manifest.binpb file (almost always refused by its CRC trailer, never a crash), and as the
// serialized Manifest inside a file whose trailer is computed here, so that mutations reach the
// protobuf parser and ValidateManifest past the checksum. Either DecodeManifestFile fails with a
// data-loss, invalid-argument or failed-precondition status, or the manifest it accepts
// re-encodes, re-decodes and re-validates identically.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/crc32c.h"
#include "checkpoint/manifest.h"
#include "checkpoint/manifest.pb.h"

using ::orthoshard::Crc32c;
using ::orthoshard::checkpoint::DecodeManifestFile;
using ::orthoshard::checkpoint::EncodeManifestFile;
using ::orthoshard::checkpoint::Manifest;
using ::orthoshard::checkpoint::ManifestToText;

namespace {

void Check(absl::string_view file) {
  const absl::StatusOr<Manifest> manifest = DecodeManifestFile(file, "fuzz input");
  if (!manifest.ok()) {
    const absl::StatusCode code = manifest.status().code();
    if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition) {
      std::abort();
    }
    return;
  }
  ManifestToText(*manifest);
  const absl::StatusOr<std::string> again = EncodeManifestFile(*manifest, "round trip");
  if (!again.ok() || !DecodeManifestFile(*again, "round trip").ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string payload(reinterpret_cast<const char*>(data), size);
  Check(payload);
  std::string file = payload;
  const uint32_t crc = Crc32c(payload.data(), payload.size());
  for (int i = 0; i < 4; ++i) file.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  Check(file + "OSM1");
  return 0;
}
