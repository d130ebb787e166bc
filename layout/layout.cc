#include "layout/layout.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "layout/internal/planning.h"

namespace orthoshard::layout {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kDistOpt:
      return "distopt";
    case Strategy::kMegatronLpt:
      return "megatron_lpt";
    case Strategy::kLayerwise:
      return "layerwise";
  }
  return "unknown";
}

absl::StatusOr<Strategy> ParseStrategy(absl::string_view name) {
  for (Strategy s : {Strategy::kDistOpt, Strategy::kMegatronLpt, Strategy::kLayerwise}) {
    if (name == StrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "strategy '", name, "' is unknown; expected one of layerwise, megatron_lpt, distopt"));
}

namespace {
auto KeyTuple(const BufferKey& k) {
  return std::make_tuple(static_cast<int>(k.param_dtype), static_cast<int>(k.grad_dtype), k.expert,
                         k.layerwise);
}
}  // namespace

bool BufferKey::operator==(const BufferKey& other) const {
  return KeyTuple(*this) == KeyTuple(other);
}
bool BufferKey::operator<(const BufferKey& other) const {
  return KeyTuple(*this) < KeyTuple(other);
}
std::string BufferKey::ToString() const {
  return absl::StrCat(DTypeName(param_dtype), "/", DTypeName(grad_dtype), "/",
                      expert ? "expert" : "dense", "/", layerwise ? "layerwise" : "distopt");
}

int64_t PerBufferParamLayout::numel() const { return buckets.empty() ? 0 : buckets.back().end; }

int PerBufferParamLayout::OwnerOf(const ParamPlacement& param) const {
  if (param.bucket < 0 || param.bucket >= static_cast<int>(buckets.size())) return -1;
  const Bucket& b = buckets[param.bucket];
  if (b.shard_size <= 0 || param.end <= param.start) return -1;
  const int64_t first = (param.start - b.start) / b.shard_size;
  const int64_t last = (param.end - 1 - b.start) / b.shard_size;
  return first == last ? static_cast<int>(first) : -1;
}

std::pair<int64_t, int64_t> PerBufferParamLayout::ShardRange(int bucket, int rank) const {
  const Bucket& b = buckets[bucket];
  return {b.start + rank * b.shard_size, b.start + (rank + 1) * b.shard_size};
}

const ParamPlacement* PerBufferParamLayout::Find(absl::string_view name) const {
  for (const ParamPlacement& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::pair<int, const ParamPlacement*> FullParamLayout::Find(absl::string_view name) const {
  for (int i = 0; i < static_cast<int>(buffers.size()); ++i) {
    if (const ParamPlacement* p = buffers[i].Find(name)) return {i, p};
  }
  return {-1, nullptr};
}

namespace internal_layout {

int64_t BucketEndDivisor(int dp) { return std::lcm(static_cast<int64_t>(dp), int64_t{128}); }

int64_t ShardDivisor(int dp) { return std::lcm(kParamAlignment, BucketEndDivisor(dp) / dp); }

double NsCost(const ParamSpec& spec) {
  if (spec.shape.size() != 2) return static_cast<double>(spec.numel());
  const double m = static_cast<double>(std::max(spec.shape[0], spec.shape[1]));
  const double n = static_cast<double>(std::min(spec.shape[0], spec.shape[1]));
  return m * n * n;
}

void EmitShardAlignedBucket(const std::vector<ParamSpec>& specs, const ShardPacking& packing,
                            PerBufferParamLayout* out) {
  const int64_t bucket_start = out->numel();
  const int bucket_id = static_cast<int>(out->buckets.size());
  const int dp = static_cast<int>(packing.shards.size());
  for (int r = 0; r < dp; ++r) {
    int64_t cursor = bucket_start + r * packing.shard_size;
    for (int index : packing.shards[r]) {
      cursor = Pad64(cursor);
      const int64_t numel = specs[index].numel();
      out->params.push_back(ParamPlacement{specs[index].name, index, cursor, cursor + numel,
                                           bucket_id, specs[index].role, specs[index].tp});
      out->unpadded_numel += numel;
      cursor += numel;
    }
  }
  out->buckets.push_back(
      Bucket{bucket_start, bucket_start + dp * packing.shard_size, packing.shard_size});
}

// ZeRO-1 byte-level layout, as Megatron's DistributedOptimizer lays out a buffer: backprop order,
// 64-aligned param starts, a bucket closes once it holds >= bucket_size elements, bucket ends
// padded to lcm(dp, 128), a shared embedding isolated in a bucket of its own (with
// isolate_large_params, every param of >= bucket_size elements too).
void PlanDistOpt(const BufferInput& input, PerBufferParamLayout* out) {
  const std::vector<ParamSpec>& specs = *input.specs;
  const int64_t end_divisor = BucketEndDivisor(input.dp);
  int64_t bucket_start = 0;
  int64_t cursor = 0;
  bool open = false;
  auto close_bucket = [&]() {
    if (!open) return;
    const int64_t end = PadTo(cursor, end_divisor);
    out->buckets.push_back(Bucket{bucket_start, end, (end - bucket_start) / input.dp});
    bucket_start = cursor = end;
    open = false;
  };
  for (auto it = input.indices.rbegin(); it != input.indices.rend(); ++it) {
    const ParamSpec& spec = specs[*it];
    const bool alone = spec.shared_embedding ||
                       (input.isolate_large_params && input.bucket_size.has_value() &&
                        spec.numel() >= *input.bucket_size);
    if (alone) close_bucket();
    const int64_t start = Pad64(cursor);
    const int64_t numel = spec.numel();
    out->params.push_back(ParamPlacement{spec.name, *it, start, start + numel,
                                         static_cast<int>(out->buckets.size()), spec.role,
                                         spec.tp});
    out->unpadded_numel += numel;
    cursor = start + numel;
    open = true;
    if (alone || (input.bucket_size.has_value() && cursor - bucket_start >= *input.bucket_size)) {
      close_bucket();
    }
  }
  close_bucket();
}

}  // namespace internal_layout

namespace {

// Bound on the elements of all params together: far beyond any model, and small enough that padded
// buffer offsets stay well inside int64_t (a shape like [2^62, 4] would otherwise overflow numel()).
constexpr int64_t kMaxTotalNumel = int64_t{1} << 50;

// Bound on dp x (elements of all params): a padded buffer never exceeds dp times its params (each
// bucket spans at most dp shards of at most the bucket's elements), and the planners multiply dp by
// param sizes, so this keeps every offset and product inside int64_t with room for alignment.
constexpr int64_t kMaxShardedNumel = int64_t{1} << 60;
// The planner keeps per-shard state (loads, ranges), so a data-parallel size is bounded: 2^20
// ranks is far above any cluster, and 2^30 made it allocate gigabytes (found by the spec fuzzer).
constexpr int kMaxDp = 1 << 20;

absl::Status ValidateParams(const std::vector<ParamSpec>& params) {
  std::set<std::string> names;
  int64_t total_numel = 0;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const ParamSpec& p = params[i];
    if (p.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("param at index ", i, ": name is empty; expected a unique non-empty name"));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' (index ", i,
                                                     "): duplicate name; names must be unique"));
    }
    int64_t numel = 1;
    for (int d = 0; d < static_cast<int>(p.shape.size()); ++d) {
      if (p.shape[d] <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("param '", p.name, "' (index ", i, "): dimension ", d, " is ",
                         p.shape[d], "; expected > 0"));
      }
      if (numel > kMaxTotalNumel / p.shape[d]) {
        return absl::InvalidArgumentError(
            absl::StrCat("param '", p.name, "' (index ", i, "): shape [",
                         absl::StrJoin(p.shape, ","), "] has more than 2^50 elements"));
      }
      numel *= p.shape[d];
    }
    total_numel += numel;
    if (total_numel > kMaxTotalNumel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", p.name, "' (index ", i, "): the params up to it hold more than 2^50 elements"));
    }
    if (p.role == ParamRole::kMuon && p.shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", p.name, "' (index ", i, "): role muon needs a 2-D shape, got [",
          absl::StrJoin(p.shape, ","), "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const LayoutOptions& options) {
  if (options.dp < 1 || options.dp > kMaxDp) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp is ", options.dp, "; expected >= 1 and <= ", kMaxDp, " (2^20)"));
  }
  if (options.expert_dp < 0 || options.expert_dp > kMaxDp) {
    return absl::InvalidArgumentError(absl::StrCat("expert_dp is ", options.expert_dp,
                                                   "; expected >= 0 (0 means dp) and <= ", kMaxDp,
                                                   " (2^20)"));
  }
  if (options.bucket_size.has_value() && *options.bucket_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket_size is ", *options.bucket_size, "; expected >= 1 (or none for one bucket)"));
  }
  if (!(options.padding_tolerance >= 0.0 && options.padding_tolerance <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("padding_tolerance is ",
                                                   options.padding_tolerance,
                                                   "; expected a fraction in [0, 1]"));
  }
  if (!(options.max_padding_tolerance >= 0.0 && options.max_padding_tolerance <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("max_padding_tolerance is ",
                                                   options.max_padding_tolerance,
                                                   "; expected a fraction in [0, 1]"));
  }
  if (options.target_buckets < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_buckets is ", options.target_buckets, "; expected >= 0 (0: bucket_size alone)"));
  }
  if (options.max_bucket_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_bucket_size is ", options.max_bucket_size, "; expected >= 1"));
  }
  if (options.min_buckets < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_buckets is ", options.min_buckets, "; expected >= 0 (0: no minimum)"));
  }
  return absl::OkStatus();
}

// The soft minimum bucket size of the buffer holding params[indices]: LayoutOptions::bucket_size,
// grown to the buffer's elements / target_buckets up to max_bucket_size.
std::optional<int64_t> BufferBucketSize(const std::vector<ParamSpec>& params,
                                        const std::vector<int>& indices,
                                        const LayoutOptions& options) {
  if (!options.bucket_size.has_value() || options.target_buckets == 0) return options.bucket_size;
  int64_t numel = 0;
  for (int i : indices) numel += params[i].numel();
  const int64_t share = (numel + options.target_buckets - 1) / options.target_buckets;
  return std::max(*options.bucket_size, std::min(share, options.max_bucket_size));
}

// Strategy::kLayerwise with LayoutOptions::min_buckets: the plan at the given bucket size and
// tolerance, or, when it has too few buckets, the first plan with enough among: the bucket size
// lowered to the buffer's elements / min_buckets (a soft minimum above that leaves no room for
// min_buckets buckets), then also the tolerance doubled up to max_padding_tolerance; else the one
// with the most buckets (the earliest among equals).
void PlanLayerwiseWithMinBuckets(internal_layout::BufferInput input, const LayoutOptions& options,
                                 PerBufferParamLayout* out) {
  const PerBufferParamLayout empty = *out;
  internal_layout::PlanLayerwise(input, out);
  if (static_cast<int>(out->buckets.size()) >= options.min_buckets) return;
  auto try_plan = [&](const internal_layout::BufferInput& candidate_input) {
    PerBufferParamLayout candidate = empty;
    internal_layout::PlanLayerwise(candidate_input, &candidate);
    if (candidate.buckets.size() > out->buckets.size()) *out = std::move(candidate);
    return static_cast<int>(out->buckets.size()) >= options.min_buckets;
  };
  int64_t numel = 0;
  for (int i : input.indices) numel += (*input.specs)[i].numel();
  const int64_t share = std::max<int64_t>(1, numel / options.min_buckets);
  if (input.bucket_size.has_value() && *input.bucket_size > share) {
    input.bucket_size = share;
    if (try_plan(input)) return;
  }
  // The smallest step: doubling from 0 would never move.
  constexpr double kFirstRaise = 0.001;
  double tolerance = input.padding_tolerance;
  while (tolerance < options.max_padding_tolerance) {
    tolerance = std::min(std::max(2 * tolerance, kFirstRaise), options.max_padding_tolerance);
    input.padding_tolerance = tolerance;
    if (try_plan(input)) return;
  }
}

}  // namespace

absl::StatusOr<FullParamLayout> ComputeFullParamLayout(const std::vector<ParamSpec>& params,
                                                        const LayoutOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  RETURN_IF_ERROR(ValidateParams(params));
  int64_t total_numel = 0;  // <= 2^50 (ValidateParams)
  for (const ParamSpec& p : params) total_numel += p.numel();
  const int64_t max_dp = std::max(options.dp, options.expert_dp);
  if (total_numel > kMaxShardedNumel / max_dp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dp ", max_dp, " x ", total_numel,
        " elements is beyond what a buffer can address (at most 2^60 over all ranks)"));
  }
  const bool shard_aligned_muon = options.muon_strategy != Strategy::kDistOpt;
  std::map<BufferKey, std::vector<int>> groups;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const ParamSpec& p = params[i];
    BufferKey key;
    key.param_dtype = p.dtype;
    key.grad_dtype = options.grad_dtype.value_or(p.dtype);
    key.expert = p.expert;
    key.layerwise = shard_aligned_muon && p.role == ParamRole::kMuon;
    groups[key].push_back(i);
  }
  FullParamLayout full;
  for (auto& [key, indices] : groups) {
    PerBufferParamLayout buffer;
    buffer.key = key;
    buffer.strategy = key.layerwise ? options.muon_strategy : Strategy::kDistOpt;
    buffer.dp = key.expert && options.expert_dp > 0 ? options.expert_dp : options.dp;
    internal_layout::BufferInput input;
    input.specs = &params;
    input.indices = indices;
    input.dp = buffer.dp;
    input.bucket_size = BufferBucketSize(params, indices, options);
    input.padding_tolerance = options.padding_tolerance;
    input.isolate_large_params = options.isolate_large_params;
    switch (buffer.strategy) {
      case Strategy::kDistOpt:
        internal_layout::PlanDistOpt(input, &buffer);
        break;
      case Strategy::kMegatronLpt:
        internal_layout::PlanMegatronLpt(input, &buffer);
        break;
      case Strategy::kLayerwise:
        PlanLayerwiseWithMinBuckets(input, options, &buffer);
        break;
    }
    std::sort(buffer.params.begin(), buffer.params.end(),
              [](const ParamPlacement& a, const ParamPlacement& b) { return a.start < b.start; });
    full.buffers.push_back(std::move(buffer));
  }
  return full;
}

}  // namespace orthoshard::layout
