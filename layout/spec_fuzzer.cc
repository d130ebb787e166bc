// Fuzz target for the model-spec parser (layout/spec.h) and the validation the planner applies to
// what it returns: any input is rejected with kInvalidArgument or planned, under every strategy.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/layout.h"
#include "layout/spec.h"

using ::orthoshard::layout::ComputeFullParamLayout;
using ::orthoshard::layout::FullParamLayout;
using ::orthoshard::layout::LayoutOptions;
using ::orthoshard::layout::ParamSpec;
using ::orthoshard::layout::ParseModelSpecJson;
using ::orthoshard::layout::Strategy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::vector<ParamSpec>> params =
      ParseModelSpecJson(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!params.ok()) {
    if (params.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  for (Strategy strategy : {Strategy::kLayerwise, Strategy::kMegatronLpt, Strategy::kDistOpt}) {
    LayoutOptions options;
    options.dp = 4;
    options.bucket_size = 1 << 20;
    options.muon_strategy = strategy;
    absl::StatusOr<FullParamLayout> layout = ComputeFullParamLayout(*params, options);
    if (!layout.ok() && layout.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  }
  return 0;
}
