// The `plan` tool as a library: resolve a model (spec file or preset) and options, plan it, and
// render the plan with its metrics as one JSON document. main() in plan_main.cc only parses flags
// and maps the Status to an exit code, so everything here is unit-tested.
#ifndef ORTHOSHARD_LAYOUT_PLAN_H_
#define ORTHOSHARD_LAYOUT_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "layout/layout.h"

namespace orthoshard::layout {

// The tool's flags, as text where the tool accepts words.
struct PlanRequest {
  std::string model;                    // path to SPEC.json; exactly one of model / preset
  std::string preset;                   // a name from PresetNames()
  int dp = 0;                           // >= 1
  int expert_dp = 0;                    // 0 means dp
  std::string strategy = "layerwise";   // for Muon-managed buffers: layerwise|megatron_lpt|distopt
  // Elements per bucket: a positive integer, "none" (one bucket per buffer), or empty for
  // Megatron's default max(40,000,000, 1,000,000 * dp).
  std::string bucket_size;
  // LayoutOptions::padding_tolerance, min_buckets and max_padding_tolerance (layerwise buffers).
  double padding_tolerance = 0.001;
  int min_buckets = 0;
  double max_padding_tolerance = 0.05;
  // LayoutOptions::target_buckets and max_bucket_size (every buffer).
  int target_buckets = 0;
  int64_t max_bucket_size = int64_t{25} << 18;
};

// Renders `layout` (planned from `params` with `options`) as JSON: {"strategy", "dp", "expert_dp",
// "bucket_size", "padding_tolerance", "min_buckets", "max_padding_tolerance", "target_buckets",
// "max_bucket_size", "buffers": [{"key", "strategy", "dp", "buckets": [{"start", "end",
// "shard_size"}], "params": [{"name", "start", "end", "bucket", "owner"}], "metrics": {...}}]}.
std::string LayoutToJson(const FullParamLayout& layout, const std::vector<ParamSpec>& params,
                         const LayoutOptions& options);

// Plans `request` and returns the JSON document. Errors: kInvalidArgument for bad flags or a bad
// spec (the message names the flag or params[i] entry and what was expected), kNotFound for an
// unreadable spec file.
absl::StatusOr<std::string> RunPlan(const PlanRequest& request);

// Exit code of the tool for `status`: 0 if OK, 2 for bad input (kInvalidArgument, kNotFound),
// 1 otherwise.
int ExitCodeFor(const absl::Status& status);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_PLAN_H_
