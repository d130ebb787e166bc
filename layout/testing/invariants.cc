#include "layout/testing/invariants.h"

#include <map>
#include <numeric>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace orthoshard::layout::testing {
namespace {

absl::Status Fail(const PerBufferParamLayout& b, const std::string& what) {
  return absl::InternalError(absl::StrCat("buffer ", b.key.ToString(), ": ", what));
}

}  // namespace

absl::Status CheckLayoutInvariants(const FullParamLayout& layout,
                                   const std::vector<ParamSpec>& params,
                                   const LayoutOptions& options) {
  std::vector<int> seen(params.size(), 0);
  for (size_t bi = 0; bi < layout.buffers.size(); ++bi) {
    const PerBufferParamLayout& b = layout.buffers[bi];
    if (bi > 0 && !(layout.buffers[bi - 1].key < b.key)) return Fail(b, "buffers not ordered by key");
    const int dp = b.key.expert && options.expert_dp > 0 ? options.expert_dp : options.dp;
    if (b.dp != dp) return Fail(b, absl::StrCat("dp ", b.dp, ", expected ", dp));
    const bool aligned = b.strategy != Strategy::kDistOpt;
    const int64_t end_divisor = std::lcm(static_cast<int64_t>(dp), int64_t{128});
    const int64_t shard_divisor = std::lcm(int64_t{64}, end_divisor / dp);
    if (b.buckets.empty()) return Fail(b, "no buckets");
    std::vector<int> bucket_params(b.buckets.size(), 0);
    for (size_t k = 0; k < b.buckets.size(); ++k) {
      const Bucket& bucket = b.buckets[k];
      const int64_t expected_start = k == 0 ? 0 : b.buckets[k - 1].end;
      if (bucket.start != expected_start) return Fail(b, absl::StrCat("bucket ", k, " not contiguous"));
      if (bucket.shard_size <= 0 || bucket.end - bucket.start != dp * bucket.shard_size) {
        return Fail(b, absl::StrCat("bucket ", k, " size != dp * shard_size"));
      }
      if (bucket.end % end_divisor != 0) return Fail(b, absl::StrCat("bucket ", k, " end unaligned"));
      if (aligned && bucket.shard_size % shard_divisor != 0) {
        return Fail(b, absl::StrCat("bucket ", k, " shard_size ", bucket.shard_size,
                                    " not a multiple of ", shard_divisor));
      }
    }
    int64_t unpadded = 0;
    for (size_t i = 0; i < b.params.size(); ++i) {
      const ParamPlacement& p = b.params[i];
      if (p.param_index < 0 || p.param_index >= static_cast<int>(params.size())) {
        return Fail(b, absl::StrCat("bad param_index ", p.param_index));
      }
      const ParamSpec& spec = params[p.param_index];
      ++seen[p.param_index];
      if (p.name != spec.name) return Fail(b, absl::StrCat("name ", p.name, " != ", spec.name));
      if (p.role != spec.role) {
        return Fail(b, absl::StrCat("param ", p.name, ": placement's role is not the spec's"));
      }
      if (p.numel() != spec.numel()) return Fail(b, absl::StrCat(p.name, " has wrong numel"));
      const bool layerwise = options.muon_strategy != Strategy::kDistOpt && spec.role == ParamRole::kMuon;
      if (spec.expert != b.key.expert || spec.dtype != b.key.param_dtype ||
          layerwise != b.key.layerwise ||
          options.grad_dtype.value_or(spec.dtype) != b.key.grad_dtype) {
        return Fail(b, absl::StrCat(p.name, " is in the wrong buffer"));
      }
      if (p.start % 64 != 0) return Fail(b, absl::StrCat(p.name, " start not 64-aligned"));
      if (i > 0 && p.start < b.params[i - 1].end) return Fail(b, absl::StrCat(p.name, " overlaps"));
      if (p.bucket < 0 || p.bucket >= static_cast<int>(b.buckets.size())) {
        return Fail(b, absl::StrCat(p.name, " bad bucket"));
      }
      const Bucket& bucket = b.buckets[p.bucket];
      if (p.start < bucket.start || p.end > bucket.end) {
        return Fail(b, absl::StrCat(p.name, " outside its bucket"));
      }
      ++bucket_params[p.bucket];
      unpadded += p.numel();
      const int owner = b.OwnerOf(p);
      if (aligned && owner < 0) return Fail(b, absl::StrCat(p.name, " crosses a shard boundary"));
      if (owner >= 0) {
        const auto [lo, hi] = b.ShardRange(p.bucket, owner);
        if (p.start < lo || p.end > hi) return Fail(b, absl::StrCat(p.name, " owner wrong"));
      }
      if (b.Find(p.name) != &p) return Fail(b, absl::StrCat(p.name, " not found by Find"));
    }
    if (unpadded != b.unpadded_numel) return Fail(b, "unpadded_numel wrong");
    for (size_t k = 0; k < bucket_params.size(); ++k) {
      if (bucket_params[k] == 0) return Fail(b, absl::StrCat("bucket ", k, " empty"));
    }
    // Backprop order: walking params by decreasing model index, bucket ids never decrease.
    std::map<int, const ParamPlacement*> by_index;
    for (const ParamPlacement& p : b.params) by_index[p.param_index] = &p;
    int last_bucket = -1;
    int64_t last_start = -1;
    for (auto it = by_index.rbegin(); it != by_index.rend(); ++it) {
      const ParamPlacement& p = *it->second;
      if (p.bucket < last_bucket) return Fail(b, absl::StrCat(p.name, " breaks backprop order"));
      if (!aligned && p.start < last_start) return Fail(b, absl::StrCat(p.name, " out of order"));
      last_bucket = p.bucket;
      last_start = p.start;
      if (params[p.param_index].shared_embedding && bucket_params[p.bucket] != 1) {
        return Fail(b, absl::StrCat(p.name, " shares its bucket"));
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (seen[i] != 1) {
      return absl::InternalError(absl::StrCat("param ", params[i].name, " placed ", seen[i], " times"));
    }
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> RandomModel(uint64_t seed, int max_params) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  static constexpr int64_t kDims[] = {1, 3, 64, 128, 333, 1000, 1024, 2048, 4096};
  auto dim = [&]() {
    return uniform(0, 2) == 0 ? uniform(1, 5000) : kDims[uniform(0, std::size(kDims) - 1)];
  };
  const int n = static_cast<int>(uniform(1, max_params));
  const int shared = uniform(0, 9) == 0 ? static_cast<int>(uniform(0, n - 1)) : -1;
  std::vector<ParamSpec> params;
  for (int i = 0; i < n; ++i) {
    ParamSpec p;
    p.name = absl::StrCat("p", i);
    const int rank = static_cast<int>(uniform(0, 9) < 7 ? 2 : uniform(0, 1));
    for (int d = 0; d < rank; ++d) p.shape.push_back(dim());
    p.role = rank == 2 && uniform(0, 9) < 7 ? ParamRole::kMuon : ParamRole::kAdam;
    p.dtype = uniform(0, 9) == 0 ? DType::kFloat32 : DType::kBFloat16;
    p.expert = uniform(0, 3) == 0;
    p.shared_embedding = i == shared;
    params.push_back(std::move(p));
  }
  return params;
}

}  // namespace orthoshard::layout::testing
