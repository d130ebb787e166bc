// `bazel run //layout:plan -- --model=SPEC.json|--preset=NAME --dp=N [--expert_dp=N]
//   [--strategy=layerwise|megatron_lpt|distopt] [--bucket_size=N|none] [--padding_tolerance=F]
//   [--min_buckets=N] [--max_padding_tolerance=F] [--target_buckets=N] [--max_bucket_size=N]`
// prints the parameter layout and its metrics as one JSON document.
// `bazel run //layout:plan -- --preset=NAME --tp=1,2,4,8 --dp=8,64,1024 [--format=table|json]
//   [--ns_steps=5]` (and the layout flags above) prints the tensor-parallel Muon planning table:
// per-rank Newton–Schulz FLOPs, their imbalance and the Muon traffic over tp for the owner,
// duplicated and blockwise modes at every tp x dp. Bad input: a message on stderr and exit code 2.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "layout/plan.h"

ABSL_FLAG(std::string, model, "", "Path to SPEC.json: {\"params\": [...]} in forward order");
ABSL_FLAG(std::string, preset, "",
          "Preset model: gpt8b, llama3_8b_gqa, moe_60x256, gpt2-124m, tinyllama-1.1b");
ABSL_FLAG(std::string, dp, "0",
          "Data-parallel size (1 to 2^20); with --tp a comma-separated list of sizes");
ABSL_FLAG(std::string, tp, "",
          "Tensor-parallel sizes, comma-separated (e.g. 1,2,4,8): print the tp Muon planning "
          "table of --preset instead of the layout");
ABSL_FLAG(std::string, format, "table", "With --tp: table (text) or json");
ABSL_FLAG(int, ns_steps, 5, "With --tp: Newton-Schulz iterations counted");
ABSL_FLAG(int, expert_dp, 0, "Expert data-parallel size (up to 2^20); 0 means --dp");
ABSL_FLAG(std::string, strategy, "layerwise",
          "Layout of Muon-managed buffers: layerwise, megatron_lpt or distopt");
ABSL_FLAG(std::string, bucket_size, "",
          "Elements per bucket, or none for one bucket; default max(40M, 1M * dp)");
ABSL_FLAG(double, padding_tolerance, 0.001,
          "Layerwise: padding (fraction of a bucket) at which a bucket boundary is accepted");
ABSL_FLAG(int, min_buckets, 0,
          "Layerwise: raise the padding tolerance (doubling, up to --max_padding_tolerance) "
          "until a buffer has this many buckets; 0: off");
ABSL_FLAG(double, max_padding_tolerance, 0.05, "Layerwise: the cap for --min_buckets");
ABSL_FLAG(int, target_buckets, 0,
          "Grow each buffer's soft minimum bucket size to its elements / this, up to "
          "--max_bucket_size; 0: off");
ABSL_FLAG(int64_t, max_bucket_size, int64_t{25} << 18, "The cap for --target_buckets (elements)");

namespace {

// The request of the flags, or the message of a malformed size list.
absl::StatusOr<orthoshard::layout::PlanRequest> RequestOfFlags() {
  orthoshard::layout::PlanRequest request;
  absl::StatusOr<std::vector<int>> dps =
      orthoshard::layout::ParseSizeList("dp", absl::GetFlag(FLAGS_dp));
  if (!dps.ok()) return dps.status();
  request.dp = dps->front();
  if (dps->size() > 1) request.dp_sweep = *dps;
  if (!absl::GetFlag(FLAGS_tp).empty()) {
    absl::StatusOr<std::vector<int>> tps =
        orthoshard::layout::ParseSizeList("tp", absl::GetFlag(FLAGS_tp));
    if (!tps.ok()) return tps.status();
    request.tp = *tps;
  }
  request.format = absl::GetFlag(FLAGS_format);
  request.ns_steps = absl::GetFlag(FLAGS_ns_steps);
  request.model = absl::GetFlag(FLAGS_model);
  request.preset = absl::GetFlag(FLAGS_preset);
  request.expert_dp = absl::GetFlag(FLAGS_expert_dp);
  request.strategy = absl::GetFlag(FLAGS_strategy);
  request.bucket_size = absl::GetFlag(FLAGS_bucket_size);
  request.padding_tolerance = absl::GetFlag(FLAGS_padding_tolerance);
  request.min_buckets = absl::GetFlag(FLAGS_min_buckets);
  request.max_padding_tolerance = absl::GetFlag(FLAGS_max_padding_tolerance);
  request.target_buckets = absl::GetFlag(FLAGS_target_buckets);
  request.max_bucket_size = absl::GetFlag(FLAGS_max_bucket_size);
  return request;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<orthoshard::layout::PlanRequest> request = RequestOfFlags();
  absl::StatusOr<std::string> json =
      request.ok() ? orthoshard::layout::RunPlan(*request) : request.status();
  if (!json.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(json.status().message()).c_str());
    return orthoshard::layout::ExitCodeFor(json.status());
  }
  std::fwrite(json->data(), 1, json->size(), stdout);
  return 0;
}
