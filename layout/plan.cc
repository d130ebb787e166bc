#include "layout/plan.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "layout/metrics.h"
#include "layout/presets.h"
#include "layout/spec.h"
#include "layout/tp_plan.h"

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

LayoutOptions LayoutOptionsOf(const PlanRequest& request, int dp) {
  LayoutOptions options;
  options.dp = dp;
  options.expert_dp = request.expert_dp;
  options.padding_tolerance = request.padding_tolerance;
  options.min_buckets = request.min_buckets;
  options.max_padding_tolerance = request.max_padding_tolerance;
  options.target_buckets = request.target_buckets;
  options.max_bucket_size = request.max_bucket_size;
  return options;
}

absl::Status ValidateDp(int dp, int expert_dp) {
  if (dp < 1) return absl::InvalidArgumentError(absl::StrCat("--dp is ", dp, "; expected >= 1"));
  if (expert_dp < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--expert_dp is ", expert_dp, "; expected >= 1 (or 0 for --dp)"));
  }
  return absl::OkStatus();
}

// The tp table: every (tp, dp) planned first, so that bad input prints nothing.
absl::StatusOr<std::string> RunTpPlan(const PlanRequest& request) {
  if (request.preset.empty()) {
    return absl::InvalidArgumentError(
        "--tp needs --preset: a spec file (--model) carries no tensor-parallel splits");
  }
  if (request.format != "table" && request.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format '", request.format, "': expected table or json"));
  }
  const std::vector<int> dps =
      request.dp_sweep.empty() ? std::vector<int>{request.dp} : request.dp_sweep;
  ASSIGN_OR_RETURN(const auto splits, PresetSplits(request.preset));
  ASSIGN_OR_RETURN(const Strategy strategy, ParseStrategy(request.strategy));
  std::vector<TpPlan> plans;
  for (int tp : request.tp) {
    ASSIGN_OR_RETURN(const std::vector<ParamSpec> params, PresetParams(request.preset, tp));
    for (int dp : dps) {
      RETURN_IF_ERROR(ValidateDp(dp, request.expert_dp));
      TpPlanOptions options;
      options.tp = tp;
      options.ns_steps = request.ns_steps;
      options.layout = LayoutOptionsOf(request, dp);
      options.layout.muon_strategy = strategy;
      ASSIGN_OR_RETURN(options.layout.bucket_size, ParseBucketSize(request.bucket_size, dp));
      absl::StatusOr<TpPlan> plan = PlanTpMuon(params, splits, options);
      if (!plan.ok()) {
        return absl::Status(plan.status().code(), absl::StrCat("--tp=", tp, " --dp=", dp, ": ",
                                                               plan.status().message()));
      }
      plans.push_back(*std::move(plan));
    }
  }
  return request.format == "json" ? TpPlanJson(request.preset, plans)
                                  : TpPlanTable(request.preset, plans);
}

std::string ModeJson(const TpModePlan& m) {
  return absl::StrCat("{\"total_ns_flops\": ", m.total_ns_flops, ", \"max_ns_flops\": ",
                      m.max_ns_flops, ", \"mean_ns_flops\": ", JsonNumber(m.mean_ns_flops),
                      ", \"ns_imbalance\": ", JsonNumber(m.ns_imbalance),
                      ", \"max_tp_bytes\": ", m.max_tp_bytes, ", \"mean_tp_bytes\": ",
                      JsonNumber(m.mean_tp_bytes), "}");
}

}  // namespace

std::string TpPlanTable(const std::string& preset, const std::vector<TpPlan>& plans) {
  std::string out = absl::StrCat(
      "Tensor-parallel Muon plan for ", preset,
      plans.empty() ? "" : absl::StrCat(", ", plans.front().ns_steps, " Newton-Schulz steps"),
      "\n"
      "GFLOP: Newton-Schulz FLOPs per step of the busiest rank of the tp x dp grid, (max/mean).\n"
      "tp MB: bytes the busiest rank sends per step over its tp group for Muon (it receives as "
      "many); blockwise sends none.\n"
      "dp MB: bytes each rank sends per step over dp (grad reduce-scatter + param all-gather), "
      "the same in every mode.\n");
  absl::StrAppend(&out,
                  absl::StrFormat("%4s %6s %7s | %19s | %19s | %19s | %9s | %10s %10s | %10s\n",
                                  "tp", "dp", "ranks", "owner GFLOP", "duplicated GFLOP",
                                  "blockwise GFLOP", "owner/dup", "owner tpMB",
                                  "dup tpMB", "dp MB"));
  for (const TpPlan& p : plans) {
    auto flops = [](const TpModePlan& m) {
      return absl::StrFormat("%10.1f (%.3f)", static_cast<double>(m.max_ns_flops) / 1e9,
                             m.ns_imbalance);
    };
    const double ratio = p.duplicated.max_ns_flops > 0
                             ? static_cast<double>(p.owner.max_ns_flops) /
                                   static_cast<double>(p.duplicated.max_ns_flops)
                             : 1.0;
    absl::StrAppend(
        &out, absl::StrFormat("%4d %6d %7d | %19s | %19s | %19s | %9.3f | %10.1f %10.1f | %10.1f\n",
                              p.tp, p.dp, p.tp * p.dp, flops(p.owner), flops(p.duplicated),
                              flops(p.blockwise), ratio,
                              static_cast<double>(p.owner.max_tp_bytes) / 1e6,
                              static_cast<double>(p.duplicated.max_tp_bytes) / 1e6,
                              static_cast<double>(p.dp_bytes) / 1e6));
  }
  return out;
}

std::string TpPlanJson(const std::string& preset, const std::vector<TpPlan>& plans) {
  std::string out = absl::StrCat("{\"preset\": ", JsonString(preset), ", \"ns_steps\": ",
                                 plans.empty() ? 0 : plans.front().ns_steps, ", \"plans\": [");
  for (size_t i = 0; i < plans.size(); ++i) {
    const TpPlan& p = plans[i];
    absl::StrAppend(&out, i ? ",\n" : "\n", "{\"tp\": ", p.tp, ", \"dp\": ", p.dp,
                    ", \"ranks\": ", p.tp * p.dp, ", \"tp_split_matrices\": ",
                    p.tp_split_matrices, ", \"replicated_matrices\": ", p.replicated_matrices,
                    ", \"dp_bytes\": ", p.dp_bytes, ", \"modes\": {");
    for (TpMuonMode mode : kTpMuonModes) {
      absl::StrAppend(&out, mode == TpMuonMode::kOwner ? "" : ", ", "\"", TpMuonModeName(mode),
                      "\": ", ModeJson(p.mode(mode)));
    }
    absl::StrAppend(&out, "}}");
  }
  return out + "]}\n";
}

absl::StatusOr<std::vector<int>> ParseSizeList(const std::string& flag, const std::string& text) {
  std::vector<int> sizes;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(item, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " '", text, "': expected a comma-separated list of integers"));
    }
    sizes.push_back(value);
  }
  return sizes;
}

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
  if (!request.tp.empty()) return RunTpPlan(request);
  if (!request.dp_sweep.empty()) {
    return absl::InvalidArgumentError("--dp: a list of sizes needs --tp (the tp planning table)");
  }
  RETURN_IF_ERROR(ValidateDp(request.dp, request.expert_dp));
  LayoutOptions options = LayoutOptionsOf(request, request.dp);
  ASSIGN_OR_RETURN(options.muon_strategy, ParseStrategy(request.strategy));
  ASSIGN_OR_RETURN(options.bucket_size, ParseBucketSize(request.bucket_size, request.dp));
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
