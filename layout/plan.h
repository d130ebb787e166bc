// The `plan` tool as a library: resolve a model (spec file or preset) and options, plan it, and
// render the plan with its metrics as one JSON document; or, with tensor-parallel sizes, render
// the tensor-parallel Muon planning table (layout/tp_plan.h) over a tp x dp sweep. main() in
// plan_main.cc only parses flags and maps the Status to an exit code, so everything here is
// unit-tested.
#ifndef ORTHOSHARD_LAYOUT_PLAN_H_
#define ORTHOSHARD_LAYOUT_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "layout/layout.h"
#include "layout/tp_plan.h"

namespace orthoshard::layout {

// The tool's flags, as text where the tool accepts words.
struct PlanRequest {
  std::string model;                    // path to SPEC.json; exactly one of model / preset
  std::string preset;                   // a name from PresetNames()
  int dp = 0;                           // >= 1
  // With tp: the dp sizes of the table (each >= 1); empty means {dp}. Without tp: empty.
  std::vector<int> dp_sweep;
  // Tensor-parallel sizes: empty prints the layout JSON; else the tp planning table of `preset`
  // at every tp x every dp (a spec file carries no tp splits).
  std::vector<int> tp;
  std::string format = "table";         // the tp table as "table" (text) or "json"
  int ns_steps = 5;                     // Newton–Schulz iterations the tp table counts
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

// Plans `request` and returns the JSON document (or, with tp, the tp table as text or JSON).
// Errors: kInvalidArgument for bad flags or a bad spec (the message names the flag or params[i]
// entry and what was expected), for tp without a preset, and for any (tp, dp) of the sweep the
// preset cannot take (PresetParams, PlanTpMuon): nothing is printed then; kNotFound for an
// unreadable spec file.
absl::StatusOr<std::string> RunPlan(const PlanRequest& request);

// The tp planning table of `preset` (its name, for the heading) from `plans` (in sweep order) as
// fixed-width text: one row per (tp, dp) with each mode's busiest rank's Newton–Schulz GFLOP per
// step and max/mean imbalance, owner's over duplicated's busiest rank, the busiest rank's Muon MB
// per step over tp for owner and duplicated (blockwise moves none), and the dp MB per rank.
std::string TpPlanTable(const std::string& preset, const std::vector<TpPlan>& plans);

// The same as one JSON document: {"preset", "ns_steps", "plans": [{"tp", "dp", "ranks",
// "tp_split_matrices", "replicated_matrices", "dp_bytes", "modes": {"owner": {"total_ns_flops",
// "max_ns_flops", "mean_ns_flops", "ns_imbalance", "max_tp_bytes", "mean_tp_bytes"},
// "duplicated": {...}, "blockwise": {...}}}]}.
std::string TpPlanJson(const std::string& preset, const std::vector<TpPlan>& plans);

// "1,2,4,8" → {1, 2, 4, 8}. Errors: kInvalidArgument naming `flag` for an empty list or an entry
// that is not an integer.
absl::StatusOr<std::vector<int>> ParseSizeList(const std::string& flag, const std::string& text);

// Exit code of the tool for `status`: 0 if OK, 2 for bad input (kInvalidArgument, kNotFound),
// 1 otherwise.
int ExitCodeFor(const absl::Status& status);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_PLAN_H_
