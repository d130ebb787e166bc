// Fuzz target for the Megatron `.idx` parser (data/dataset.h): any input is rejected with
// kInvalidArgument or kDataLoss, or accepted as an index whose invariants hold (what
// LoadMegatronDataset then relies on to read `.bin` without going out of bounds).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/dataset.h"

using ::orthoshard::data::MegatronIndex;
using ::orthoshard::data::ParseMegatronIndex;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<MegatronIndex> index =
      ParseMegatronIndex(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz.idx");
  if (!index.ok()) {
    const absl::StatusCode code = index.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kDataLoss) {
      std::abort();
    }
    return 0;
  }
  // Accepted: one pointer per sequence, contiguous from 0, within bin_bytes(); document starts
  // non-decreasing from 0 to the sequence count.
  if (index->element_size <= 0 || index->pointers.size() != index->lengths.size()) std::abort();
  int64_t expected = 0;
  for (size_t i = 0; i < index->lengths.size(); ++i) {
    if (index->lengths[i] < 0 || index->pointers[i] != expected) std::abort();
    expected += static_cast<int64_t>(index->lengths[i]) * index->element_size;
  }
  if (index->bin_bytes() != expected) std::abort();
  if (index->document_index.empty() || index->document_index.front() != 0 ||
      index->document_index.back() != static_cast<int64_t>(index->lengths.size())) {
    std::abort();
  }
  for (size_t i = 1; i < index->document_index.size(); ++i) {
    if (index->document_index[i] < index->document_index[i - 1]) std::abort();
  }
  return 0;
}
