// Fuzz target for the model-spec parser (layout/spec.h) and the planner on what it returns: any
// input is rejected with kInvalidArgument or planned, under every strategy, at a data-parallel size,
// expert size and bucket size drawn from the input's bytes; a plan that succeeds must satisfy every
// layout invariant (layout/testing/invariants.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/layout.h"
#include "layout/spec.h"
#include "layout/testing/invariants.h"

using ::orthoshard::layout::ComputeFullParamLayout;
using ::orthoshard::layout::FullParamLayout;
using ::orthoshard::layout::LayoutOptions;
using ::orthoshard::layout::ParamSpec;
using ::orthoshard::layout::ParseModelSpecJson;
using ::orthoshard::layout::Strategy;
using ::orthoshard::layout::testing::CheckLayoutInvariants;

namespace {

// FNV-1a of the input: picks the sizes without taking bytes away from the JSON.
uint64_t Hash(const uint8_t* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::vector<ParamSpec>> params =
      ParseModelSpecJson(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!params.ok()) {
    if (params.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  // Sizes the planner must handle: odd, powers of two, one large enough to hit the 2^60 bound with
  // big models (its invariants are not checked: the checker walks every shard).
  static constexpr int kDp[] = {1, 2, 3, 4, 7, 8, 64, 1 << 30};
  static constexpr int kExpertDp[] = {0, 1, 2, 5};
  static constexpr int64_t kBucket[] = {0, 1, 1000, 1 << 20};  // 0: one bucket per buffer
  const uint64_t h = Hash(data, size);
  LayoutOptions options;
  options.dp = kDp[h % 8];
  options.expert_dp = kExpertDp[(h >> 3) % 4];
  if (const int64_t bucket = kBucket[(h >> 5) % 4]; bucket > 0) options.bucket_size = bucket;
  for (Strategy strategy : {Strategy::kLayerwise, Strategy::kMegatronLpt, Strategy::kDistOpt}) {
    options.muon_strategy = strategy;
    absl::StatusOr<FullParamLayout> layout = ComputeFullParamLayout(*params, options);
    if (!layout.ok()) {
      if (layout.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
      continue;
    }
    if (options.dp <= 64 && !CheckLayoutInvariants(*layout, *params, options).ok()) std::abort();
  }
  return 0;
}
