#include "layout/plan.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "layout/metrics.h"
#include "layout/presets.h"
#include "layout/spec.h"

namespace orthoshard::layout {
namespace {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) { return absl::StrFormat("%.9g", v); }

std::string MetricsJson(const BufferMetrics& m) {
  std::vector<std::string> bucket_imbalance;
  for (double v : m.bucket_ns_cost_imbalance) bucket_imbalance.push_back(JsonNumber(v));
  return absl::StrCat(
      "{\"padding_fraction\": ", JsonNumber(m.padding_fraction), ", \"buckets\": ", m.buckets,
      ", \"unpadded_numel\": ", m.unpadded_numel, ", \"padded_numel\": ", m.padded_numel,
      ", \"ns_cost_imbalance\": ", JsonNumber(m.ns_cost_imbalance),
      ", \"bucket_ns_cost_imbalance\": [", absl::StrJoin(bucket_imbalance, ", "),
      "], \"numel_imbalance\": ", JsonNumber(m.numel_imbalance), ", \"rank_numel\": [",
      absl::StrJoin(m.rank_numel, ", "), "]}");
}

absl::StatusOr<std::optional<int64_t>> ParseBucketSize(const std::string& text, int dp) {
  if (text.empty()) return std::max<int64_t>(40000000, int64_t{1000000} * dp);
  if (text == "none") return std::optional<int64_t>();
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bucket_size '", text, "': expected a positive number of elements or none"));
  }
  return std::optional<int64_t>(value);
}

}  // namespace

std::string LayoutToJson(const FullParamLayout& layout, const std::vector<ParamSpec>& params,
                         const LayoutOptions& options) {
  std::string out = absl::StrCat(
      "{\"strategy\": ", JsonString(StrategyName(options.muon_strategy)), ", \"dp\": ", options.dp,
      ", \"expert_dp\": ", options.expert_dp > 0 ? options.expert_dp : options.dp,
      ", \"bucket_size\": ",
      options.bucket_size.has_value() ? absl::StrCat(*options.bucket_size) : "null",
      ", \"padding_tolerance\": ", JsonNumber(options.padding_tolerance), ", \"min_buckets\": ",
      options.min_buckets, ", \"max_padding_tolerance\": ",
      JsonNumber(options.max_padding_tolerance), ", \"target_buckets\": ", options.target_buckets,
      ", \"max_bucket_size\": ", options.max_bucket_size, ", \"buffers\": [");
  for (size_t b = 0; b < layout.buffers.size(); ++b) {
    const PerBufferParamLayout& buffer = layout.buffers[b];
    const BufferKey& k = buffer.key;
    absl::StrAppend(&out, b ? ",\n" : "\n", "{\"key\": {\"param_dtype\": ",
                    JsonString(DTypeName(k.param_dtype)), ", \"grad_dtype\": ",
                    JsonString(DTypeName(k.grad_dtype)), ", \"expert\": ",
                    k.expert ? "true" : "false", ", \"layerwise\": ",
                    k.layerwise ? "true" : "false", "}, \"name\": ", JsonString(k.ToString()),
                    ", \"strategy\": ", JsonString(StrategyName(buffer.strategy)),
                    ", \"dp\": ", buffer.dp, ",\n \"buckets\": [");
    for (size_t i = 0; i < buffer.buckets.size(); ++i) {
      const Bucket& bucket = buffer.buckets[i];
      absl::StrAppend(&out, i ? ", " : "", "{\"start\": ", bucket.start, ", \"end\": ", bucket.end,
                      ", \"shard_size\": ", bucket.shard_size, "}");
    }
    absl::StrAppend(&out, "],\n \"params\": [");
    for (size_t i = 0; i < buffer.params.size(); ++i) {
      const ParamPlacement& p = buffer.params[i];
      absl::StrAppend(&out, i ? ",\n  " : "\n  ", "{\"name\": ", JsonString(p.name),
                      ", \"start\": ", p.start, ", \"end\": ", p.end, ", \"bucket\": ", p.bucket,
                      ", \"owner\": ", buffer.OwnerOf(p), "}");
    }
    absl::StrAppend(&out, "],\n \"metrics\": ", MetricsJson(ComputeBufferMetrics(buffer, params)),
                    "}");
  }
  return out + "]}\n";
}

absl::StatusOr<std::string> RunPlan(const PlanRequest& request) {
  if (request.model.empty() == request.preset.empty()) {
    return absl::InvalidArgumentError(
        "--model and --preset: expected exactly one of them (a SPEC.json path or a preset name)");
  }
  if (request.dp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--dp is ", request.dp, "; expected >= 1"));
  }
  if (request.expert_dp < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--expert_dp is ", request.expert_dp, "; expected >= 1 (or 0 for --dp)"));
  }
  LayoutOptions options;
  options.dp = request.dp;
  options.expert_dp = request.expert_dp;
  ASSIGN_OR_RETURN(options.muon_strategy, ParseStrategy(request.strategy));
  ASSIGN_OR_RETURN(options.bucket_size, ParseBucketSize(request.bucket_size, request.dp));
  options.padding_tolerance = request.padding_tolerance;
  options.min_buckets = request.min_buckets;
  options.max_padding_tolerance = request.max_padding_tolerance;
  options.target_buckets = request.target_buckets;
  options.max_bucket_size = request.max_bucket_size;
  std::vector<ParamSpec> params;
  if (!request.model.empty()) {
    ASSIGN_OR_RETURN(params, ReadModelSpecFile(request.model));
  } else {
    ASSIGN_OR_RETURN(params, PresetParams(request.preset));
  }
  ASSIGN_OR_RETURN(FullParamLayout layout, ComputeFullParamLayout(params, options));
  return LayoutToJson(layout, params, options);
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return 0;
  if (status.code() == absl::StatusCode::kInvalidArgument ||
      status.code() == absl::StatusCode::kNotFound) {
    return 2;
  }
  return 1;
}

}  // namespace orthoshard::layout
