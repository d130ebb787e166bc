// Unit tests of the public layout API and the cases Megatron-LM's own layout tests cover
// (test_layer_wise_param_layout.py): uniform exact fit, remainder, mixed sizes, shared-embedding
// isolation, dp divisibility, global alignment, backprop order, every param exactly once, dp 1.
// The shard-aligned cases run for both Strategy::kLayerwise and Strategy::kMegatronLpt.
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layout/layout.h"
#include "layout/metrics.h"
#include "layout/testing/invariants.h"

namespace orthoshard::layout {
namespace {

using ::orthoshard::testing::IsOk;
using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

ParamSpec Muon(std::string name, int64_t rows, int64_t cols) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {rows, cols};
  p.role = ParamRole::kMuon;
  return p;
}

ParamSpec Adam(std::string name, std::vector<int64_t> shape) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  return p;
}

std::vector<ParamSpec> Uniform(int count, int64_t rows, int64_t cols) {
  std::vector<ParamSpec> params;
  for (int i = 0; i < count; ++i) params.push_back(Muon(absl::StrCat("w", i), rows, cols));
  return params;
}

// Plans `params` and returns the single buffer (the tests use one BufferKey).
PerBufferParamLayout PlanOne(const std::vector<ParamSpec>& params, const LayoutOptions& options) {
  absl::StatusOr<FullParamLayout> layout = ComputeFullParamLayout(params, options);
  EXPECT_THAT(layout, IsOk());
  EXPECT_THAT(testing::CheckLayoutInvariants(*layout, params, options), IsOk());
  EXPECT_EQ(layout->buffers.size(), 1u);
  return layout->buffers.front();
}

class ShardAlignedTest : public ::testing::TestWithParam<Strategy> {
 protected:
  LayoutOptions Options(int dp, std::optional<int64_t> bucket_size = std::nullopt) const {
    LayoutOptions options;
    options.dp = dp;
    options.bucket_size = bucket_size;
    options.muon_strategy = GetParam();
    return options;
  }
};

TEST_P(ShardAlignedTest, UniformExactFit) {
  // 8 params of 256 elements over 4 shards: two per shard, no padding.
  const PerBufferParamLayout b = PlanOne(Uniform(8, 16, 16), Options(4));
  ASSERT_EQ(b.buckets.size(), 1u);
  EXPECT_EQ(b.buckets[0].shard_size, 512);
  EXPECT_EQ(b.numel(), 2048);
  EXPECT_EQ(b.unpadded_numel, 2048);
  std::vector<int> per_rank(4, 0);
  for (const ParamPlacement& p : b.params) ++per_rank[b.OwnerOf(p)];
  EXPECT_EQ(per_rank, std::vector<int>({2, 2, 2, 2}));
}

TEST_P(ShardAlignedTest, Remainder) {
  // 5 params of 256 over 4 shards: one shard holds two, so every shard is 512.
  const PerBufferParamLayout b = PlanOne(Uniform(5, 16, 16), Options(4));
  ASSERT_EQ(b.buckets.size(), 1u);
  EXPECT_EQ(b.buckets[0].shard_size, 512);
  EXPECT_EQ(b.unpadded_numel, 1280);
  std::multiset<int> counts;
  std::vector<int> per_rank(4, 0);
  for (const ParamPlacement& p : b.params) ++per_rank[b.OwnerOf(p)];
  counts.insert(per_rank.begin(), per_rank.end());
  EXPECT_EQ(counts, std::multiset<int>({1, 1, 1, 2}));
}

TEST_P(ShardAlignedTest, MixedSizes) {
  const std::vector<ParamSpec> params = {Muon("a", 40, 25), Muon("b", 10, 50), Muon("c", 20, 15),
                                         Muon("d", 10, 20)};
  const PerBufferParamLayout b = PlanOne(params, Options(2));
  ASSERT_EQ(b.buckets.size(), 1u);
  // {a} | {b, c, d}: b and c are followed by 64-aligned starts, 512 + 320 + 200 = 1032, rounded
  // to the shard divisor 64.
  EXPECT_EQ(b.buckets[0].shard_size, 1088);
  EXPECT_NE(b.OwnerOf(*b.Find("a")), b.OwnerOf(*b.Find("b")));
}

TEST_P(ShardAlignedTest, SharedEmbeddingIsIsolated) {
  std::vector<ParamSpec> params = Uniform(4, 16, 16);
  ParamSpec embedding = Muon("embedding", 64, 16);
  embedding.shared_embedding = true;
  params.insert(params.begin() + 2, embedding);  // forward: w0 w1 embedding w2 w3
  const PerBufferParamLayout b = PlanOne(params, Options(2));
  ASSERT_EQ(b.buckets.size(), 3u);
  const ParamPlacement* e = b.Find("embedding");
  EXPECT_EQ(e->bucket, 1);  // after the chunk {w3, w2}, before {w1, w0}
  EXPECT_EQ(b.Find("w3")->bucket, 0);
  EXPECT_EQ(b.Find("w0")->bucket, 2);
  EXPECT_EQ(b.buckets[1].shard_size, 1024);
  for (const ParamPlacement& p : b.params) {
    if (p.name != "embedding") {
      EXPECT_NE(p.bucket, 1) << p.name;
    }
  }
}

TEST_P(ShardAlignedTest, DpDivisibility) {
  for (int dp : {2, 3, 4, 8, 16}) {
    SCOPED_TRACE(dp);
    const PerBufferParamLayout b = PlanOne(Uniform(2 * dp, 9, 37), Options(dp));  // 333 each
    const int64_t end_divisor = std::lcm(int64_t{dp}, int64_t{128});
    for (const Bucket& bucket : b.buckets) {
      EXPECT_EQ(bucket.numel() % end_divisor, 0);
      EXPECT_EQ(bucket.shard_size % std::lcm(int64_t{64}, end_divisor / dp), 0);
      // Two 333-element params per shard: 64 + 333 rounded up = 448 -> shard divisor.
      EXPECT_GE(bucket.shard_size, 384 + 333);
    }
  }
}

TEST_P(ShardAlignedTest, GlobalAlignment) {
  const PerBufferParamLayout b = PlanOne(
      {Muon("a", 7, 13), Muon("b", 333, 1), Muon("c", 100, 3), Muon("d", 5, 5)}, Options(3, 200));
  for (const ParamPlacement& p : b.params) EXPECT_EQ(p.start % 64, 0) << p.name;
  for (const Bucket& bucket : b.buckets) {
    EXPECT_EQ(bucket.start % std::lcm(3, 128), 0);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(b.ShardRange(&bucket - b.buckets.data(), r).first % 64, 0);
  }
}

TEST_P(ShardAlignedTest, BackpropOrder) {
  // Small buckets: the last layer's params land in bucket 0, the first layer's in the last one.
  const std::vector<ParamSpec> params = Uniform(16, 32, 32);
  const PerBufferParamLayout b = PlanOne(params, Options(2, 2048));
  ASSERT_GT(b.buckets.size(), 1u);
  EXPECT_EQ(b.Find("w15")->bucket, 0);
  EXPECT_EQ(b.Find("w0")->bucket, static_cast<int>(b.buckets.size()) - 1);
  int previous = 0;
  for (int i = 15; i >= 0; --i) {
    const int bucket = b.Find(absl::StrCat("w", i))->bucket;
    EXPECT_GE(bucket, previous);
    previous = bucket;
  }
}

TEST_P(ShardAlignedTest, EveryParamExactlyOnce) {
  std::vector<ParamSpec> params = Uniform(7, 100, 3);
  params.push_back(Adam("norm", {100}));
  ParamSpec expert = Muon("expert", 10, 10);
  expert.expert = true;
  params.push_back(expert);
  LayoutOptions options = Options(4, 500);
  options.expert_dp = 2;
  ASSERT_OK_AND_ASSIGN(FullParamLayout layout, ComputeFullParamLayout(params, options));
  EXPECT_THAT(testing::CheckLayoutInvariants(layout, params, options), IsOk());
  ASSERT_EQ(layout.buffers.size(), 3u);
  std::multiset<std::string> names;
  for (const auto& b : layout.buffers) {
    for (const auto& p : b.params) names.insert(p.name);
  }
  EXPECT_EQ(names.size(), params.size());
  for (const ParamSpec& p : params) EXPECT_EQ(names.count(p.name), 1u) << p.name;
  EXPECT_EQ(layout.buffers[layout.Find("expert").first].dp, 2);
}

TEST_P(ShardAlignedTest, DpOne) {
  const PerBufferParamLayout b = PlanOne({Muon("a", 10, 10), Muon("b", 64, 2)}, Options(1));
  ASSERT_EQ(b.buckets.size(), 1u);
  for (const ParamPlacement& p : b.params) EXPECT_EQ(b.OwnerOf(p), 0);
  EXPECT_EQ(b.numel(), 256);  // 100 -> 128, +128 = 256, bucket end to lcm(1, 128)
}

TEST_P(ShardAlignedTest, DpLargerThanParamCount) {
  const PerBufferParamLayout b = PlanOne(Uniform(3, 16, 16), Options(8));
  ASSERT_EQ(b.buckets.size(), 1u);
  EXPECT_EQ(b.buckets[0].shard_size, 256);
  EXPECT_EQ(b.numel(), 8 * 256);
}

INSTANTIATE_TEST_SUITE_P(Strategies, ShardAlignedTest,
                         ::testing::Values(Strategy::kLayerwise, Strategy::kMegatronLpt),
                         [](const ::testing::TestParamInfo<Strategy>& info) {
                           return std::string(StrategyName(info.param));
                         });

TEST(DistOptTest, ByteLevelLayoutStraddlesShards) {
  LayoutOptions options;
  options.dp = 4;
  options.muon_strategy = Strategy::kDistOpt;
  const std::vector<ParamSpec> params = {Muon("a", 10, 30), Adam("b", {100})};
  const PerBufferParamLayout b = PlanOne(params, options);
  EXPECT_FALSE(b.key.layerwise);
  EXPECT_EQ(b.strategy, Strategy::kDistOpt);
  ASSERT_EQ(b.buckets.size(), 1u);
  // Backprop order: b at 0, a at 128; end 428 padded to lcm(4, 128) = 512.
  EXPECT_EQ(b.Find("b")->start, 0);
  EXPECT_EQ(b.Find("a")->start, 128);
  EXPECT_EQ(b.numel(), 512);
  EXPECT_EQ(b.buckets[0].shard_size, 128);
  EXPECT_EQ(b.OwnerOf(*b.Find("b")), 0);
  EXPECT_EQ(b.OwnerOf(*b.Find("a")), -1);  // [128, 428) spans shards 1..3
}

TEST(DistOptTest, BucketClosesAtBucketSizeAndSharedEmbeddingIsAlone) {
  ParamSpec embedding = Adam("embedding", {1000});
  embedding.shared_embedding = true;
  const std::vector<ParamSpec> params = {embedding, Adam("x", {300}), Adam("y", {300}),
                                         Adam("z", {300})};
  LayoutOptions options;
  options.dp = 2;
  options.bucket_size = 500;
  const PerBufferParamLayout b = PlanOne(params, options);
  ASSERT_EQ(b.buckets.size(), 3u);  // {z, y}, {x}, {embedding}
  EXPECT_EQ(b.Find("z")->bucket, 0);
  EXPECT_EQ(b.Find("y")->bucket, 0);
  EXPECT_EQ(b.Find("x")->bucket, 1);
  EXPECT_EQ(b.Find("embedding")->bucket, 2);
}

// An untied model's AdamW buffer: embedding, a norm gain per block, the head (forward order), and
// a param of exactly the bucket size between the gains. Megatron's packing closes a bucket after a
// param that fills it, so the last gains share the embedding's bucket (fsdp would gather the
// embedding with them); isolate_large_params gives each param of >= bucket_size elements a bucket
// of its own, and leaves the gains together.
TEST(DistOptTest, IsolateLargeParamsGivesEachABucketOfItsOwn) {
  const std::vector<ParamSpec> params = {Adam("embedding", {1000}), Adam("n0", {10}),
                                         Adam("mid", {500}), Adam("n1", {10}), Adam("n2", {10}),
                                         Adam("head", {1000})};
  LayoutOptions options;
  options.dp = 2;
  options.bucket_size = 500;
  const PerBufferParamLayout packed = PlanOne(params, options);
  // Backprop order: {head}, {n2, n1, mid}, {n0, embedding}; bucket ends padded to lcm(2, 128).
  ASSERT_EQ(packed.buckets.size(), 3u);
  EXPECT_EQ(packed.Find("head")->bucket, 0);
  for (const char* name : {"n2", "n1", "mid"}) EXPECT_EQ(packed.Find(name)->bucket, 1) << name;
  EXPECT_EQ(packed.Find("n0")->bucket, 2);
  EXPECT_EQ(packed.Find("embedding")->bucket, 2);
  EXPECT_EQ(packed.Find("mid")->start, 1152);  // n2 at 1024, n1 at 1088
  EXPECT_EQ(packed.Find("embedding")->start, 1728);  // n0 at 1664 (1652 padded to 128)
  EXPECT_EQ(packed.numel(), 2816);

  options.isolate_large_params = true;
  const PerBufferParamLayout alone = PlanOne(params, options);
  // {head}, {n2, n1}, {mid}, {n0}, {embedding}.
  ASSERT_EQ(alone.buckets.size(), 5u);
  EXPECT_EQ(alone.Find("head")->bucket, 0);
  EXPECT_EQ(alone.Find("n2")->bucket, 1);
  EXPECT_EQ(alone.Find("n1")->bucket, 1);
  EXPECT_EQ(alone.Find("mid")->bucket, 2);
  EXPECT_EQ(alone.Find("n0")->bucket, 3);
  EXPECT_EQ(alone.Find("embedding")->bucket, 4);
  for (const char* name : {"head", "mid", "embedding"}) {
    const ParamPlacement& p = *alone.Find(name);
    EXPECT_EQ(p.start, alone.buckets[p.bucket].start) << name;
  }
  // A param one element below the bucket size packs as before.
  std::vector<ParamSpec> below = params;
  below[2].shape = {499};
  const PerBufferParamLayout some = PlanOne(below, options);
  EXPECT_EQ(some.Find("mid")->bucket, some.Find("n1")->bucket);
  EXPECT_NE(some.Find("embedding")->bucket, some.Find("n0")->bucket);
  // Without a bucket size (one bucket) there is nothing to isolate from.
  options.bucket_size = std::nullopt;
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 1u);
}

TEST(LayoutTest, BuffersSplitByKey) {
  ParamSpec expert = Muon("expert", 8, 8);
  expert.expert = true;
  ParamSpec fp32 = Adam("fp32", {8});
  fp32.dtype = DType::kFloat32;
  const std::vector<ParamSpec> params = {Muon("m", 8, 8), Adam("a", {8}), expert, fp32};
  LayoutOptions options;
  options.dp = 2;
  options.grad_dtype = std::nullopt;
  ASSERT_OK_AND_ASSIGN(FullParamLayout layout, ComputeFullParamLayout(params, options));
  EXPECT_THAT(testing::CheckLayoutInvariants(layout, params, options), IsOk());
  std::vector<std::string> keys;
  for (const auto& b : layout.buffers) keys.push_back(b.key.ToString());
  EXPECT_THAT(keys, ::testing::ElementsAre("fp32/fp32/dense/distopt", "bf16/bf16/dense/distopt",
                                           "bf16/bf16/dense/layerwise",
                                           "bf16/bf16/expert/layerwise"));
  EXPECT_EQ(layout.Find("missing").first, -1);
  EXPECT_EQ(layout.Find("missing").second, nullptr);
}

TEST(LayoutTest, ParseStrategy) {
  for (Strategy s : {Strategy::kDistOpt, Strategy::kMegatronLpt, Strategy::kLayerwise}) {
    ASSERT_OK_AND_ASSIGN(Strategy parsed, ParseStrategy(StrategyName(s)));
    EXPECT_EQ(parsed, s);
  }
  EXPECT_THAT(ParseStrategy("lpt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("strategy 'lpt' is unknown; expected one of layerwise")));
}

TEST(LayoutTest, RejectsBadParams) {
  LayoutOptions options;
  const auto error = [&](std::vector<ParamSpec> params) {
    return ComputeFullParamLayout(params, options).status();
  };
  EXPECT_THAT(error({Adam("", {1})}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("param at index 0: name is empty")));
  EXPECT_THAT(error({Adam("a", {1}), Adam("a", {2})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'a' (index 1): duplicate name")));
  EXPECT_THAT(error({Adam("a", {4, 0})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'a' (index 0): dimension 1 is 0; expected > 0")));
  // Found by //layout:spec_fuzzer: numel() of [2^63-1, 2] overflowed int64_t.
  EXPECT_THAT(error({Adam("big", {INT64_MAX, 2})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'big' (index 0): shape [9223372036854775807,2] has more "
                                 "than 2^50 elements")));
  EXPECT_THAT(error({Adam("a", {1 << 25, 1 << 25}), Adam("b", {1 << 25, 1 << 25})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'b' (index 1): the params up to it hold more than 2^50")));
  ParamSpec vector = Adam("v", {8});
  vector.role = ParamRole::kMuon;
  EXPECT_THAT(error({vector}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'v' (index 0): role muon needs a 2-D shape, got [8]")));
}

TEST(LayoutTest, RejectsBadOptions) {
  const std::vector<ParamSpec> params = {Adam("a", {1})};
  LayoutOptions options;
  options.dp = 0;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp is 0; expected >= 1")));
  // Beyond 2^20 ranks: an error, not gigabytes of per-shard state (the spec fuzzer's find).
  options.dp = (1 << 20) + 1;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dp is 1048577; expected >= 1 and <= 1048576 (2^20)")));
  options.dp = 1;
  options.expert_dp = -1;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expert_dp is -1")));
  options.expert_dp = 1 << 30;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expert_dp is 1073741824")));
  options.expert_dp = 0;
  options.bucket_size = 0;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bucket_size is 0")));
  options.bucket_size = 1;
  for (double bad : {-0.01, 1.5, std::nan("")}) {
    options.padding_tolerance = bad;
    EXPECT_THAT(ComputeFullParamLayout(params, options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("expected a fraction in [0, 1]")));
  }
  options.padding_tolerance = 0.001;
  for (double bad : {-0.01, 1.5, std::nan("")}) {
    options.max_padding_tolerance = bad;
    EXPECT_THAT(ComputeFullParamLayout(params, options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("max_padding_tolerance is")));
  }
  options.max_padding_tolerance = 0.05;
  options.min_buckets = -1;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("min_buckets is -1; expected >= 0")));
  options.min_buckets = 0;
  options.target_buckets = -2;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("target_buckets is -2; expected >= 0")));
  options.target_buckets = 4;
  options.max_bucket_size = 0;
  EXPECT_THAT(ComputeFullParamLayout(params, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_bucket_size is 0; expected >= 1")));
}

// The `small` GPT's Muon matrices, 4 layers of qkv [384, 256], proj [256, 256], fc1 [1408, 256] and
// fc2 [256, 704].
std::vector<ParamSpec> SmallGptMuonMatrices() {
  std::vector<ParamSpec> params;
  for (int i = 0; i < 4; ++i) {
    params.push_back(Muon(absl::StrCat("l", i, ".qkv"), 384, 256));
    params.push_back(Muon(absl::StrCat("l", i, ".proj"), 256, 256));
    params.push_back(Muon(absl::StrCat("l", i, ".fc1"), 1408, 256));
    params.push_back(Muon(absl::StrCat("l", i, ".fc2"), 256, 704));
  }
  return params;
}

// target_buckets on a byte-level (distopt) buffer: the `small` GPT's 16 matrices (2.8M elements)
// make one bucket per matrix above a 64 Ki soft minimum; with target_buckets = 4 the soft minimum
// grows to a quarter of the buffer (704512 elements), so each bucket holds about a layer: 4
// buckets. max_bucket_size caps the growth (at 500000 elements: more buckets, each but the last
// >= 500000), and a bucket_size above the share stays the floor (one bucket).
TEST(DistOptTest, TargetBucketsGrowsTheSoftMinimumUpToTheCap) {
  const std::vector<ParamSpec> params = SmallGptMuonMatrices();
  LayoutOptions options;
  options.dp = 2;
  options.muon_strategy = Strategy::kDistOpt;
  options.bucket_size = 1 << 16;
  EXPECT_EQ(PlanOne(params, options).buckets.size(), params.size());
  options.target_buckets = 4;
  const PerBufferParamLayout four = PlanOne(params, options);
  ASSERT_EQ(four.buckets.size(), 4u);
  for (const Bucket& b : four.buckets) EXPECT_GE(b.end - b.start, 704512);
  options.max_bucket_size = 500000;
  const PerBufferParamLayout capped = PlanOne(params, options);
  EXPECT_GT(capped.buckets.size(), 4u);
  for (size_t i = 0; i + 1 < capped.buckets.size(); ++i) {
    EXPECT_GE(capped.buckets[i].end - capped.buckets[i].start, 500000);
  }
  options.bucket_size = 1 << 22;
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 1u);
  options.bucket_size = std::nullopt;  // one bucket, whatever the target
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 1u);
}

// The `small` GPT's Muon matrices at dp 2 (per layer fc1 [1408, 256] against fc2 + qkv + proj,
// 360448 vs 344064 elements) pack exactly only two layers at a time: at the default tolerance the
// buffer has 2 buckets, at 5% one bucket per layer with the fc1 alone in a shard (2.3% padding).
TEST(LayerwiseTest, PaddingToleranceTradesPaddingForBuckets) {
  const std::vector<ParamSpec> params = SmallGptMuonMatrices();
  LayoutOptions options;
  options.dp = 2;
  options.bucket_size = 1 << 16;
  const PerBufferParamLayout tight = PlanOne(params, options);
  EXPECT_EQ(tight.buckets.size(), 2u);
  EXPECT_EQ(tight.numel(), tight.unpadded_numel);
  options.padding_tolerance = 0.05;
  const PerBufferParamLayout loose = PlanOne(params, options);
  ASSERT_EQ(loose.buckets.size(), 4u);
  for (const Bucket& b : loose.buckets) {
    const int64_t numel = b.end - b.start;
    EXPECT_EQ(numel, 2 * 360448);  // a shard of one fc1 and one of the layer's other three
  }
  EXPECT_EQ(loose.unpadded_numel, tight.unpadded_numel);
}

// min_buckets raises the tolerance for the `small` GPT above (2 buckets at 0.1%) by doubling:
// 0.2%, 0.4%, 0.8%, 1.6% still give 2 buckets, 3.2% (>= the 2.3% of one bucket per layer) gives 4.
// The cap stops the search below that, a minimum already met or beyond reach changes nothing
// that it need not, and an unreachable minimum keeps the plan with the most buckets.
TEST(LayerwiseTest, MinBucketsRaisesThePaddingToleranceUpToTheCap) {
  const std::vector<ParamSpec> params = SmallGptMuonMatrices();
  LayoutOptions options;
  options.dp = 2;
  options.bucket_size = 1 << 16;
  const PerBufferParamLayout tight = PlanOne(params, options);
  ASSERT_EQ(tight.buckets.size(), 2u);
  options.padding_tolerance = 0.05;
  const PerBufferParamLayout loose = PlanOne(params, options);
  ASSERT_EQ(loose.buckets.size(), 4u);
  options.padding_tolerance = 0.001;

  options.min_buckets = 4;
  const PerBufferParamLayout raised = PlanOne(params, options);
  EXPECT_EQ(raised.buckets.size(), 4u);
  EXPECT_EQ(raised.numel(), loose.numel());  // the same one-bucket-per-layer plan as at 5%
  for (size_t i = 0; i < raised.params.size(); ++i) {
    EXPECT_EQ(raised.params[i].start, loose.params[i].start) << raised.params[i].name;
  }
  options.min_buckets = 3;  // 4 is the first count at or above 3
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 4u);

  options.max_padding_tolerance = 0.02;  // one bucket per layer needs 2.3%
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 2u);
  options.max_padding_tolerance = 0.05;

  options.min_buckets = 2;  // met at the given tolerance: the tight plan, no padding
  const PerBufferParamLayout met = PlanOne(params, options);
  EXPECT_EQ(met.buckets.size(), 2u);
  EXPECT_EQ(met.numel(), met.unpadded_numel);

  options.min_buckets = 100;  // beyond reach (16 matrices, 2 per bucket at least)
  const PerBufferParamLayout most = PlanOne(params, options);
  EXPECT_EQ(most.buckets.size(), 4u);
  EXPECT_EQ(most.numel(), loose.numel());

  // A soft minimum above the whole buffer makes one bucket; the rule lowers it to a quarter of
  // the buffer first, then raises the tolerance as above. One bucket stays one bucket.
  options.bucket_size = 1 << 22;
  options.min_buckets = 0;
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 1u);
  options.min_buckets = 4;
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 4u);
  options.bucket_size = std::nullopt;
  EXPECT_EQ(PlanOne(params, options).buckets.size(), 1u);
}

// dp x model size beyond int64_t offsets is an error, not an overflow, for every strategy.
TEST(LayoutTest, RejectsDpTimesModelBeyondInt64Offsets) {
  const std::vector<ParamSpec> params = {Muon("w", int64_t{1} << 20, int64_t{1} << 20),
                                         Adam("b", {int64_t{1} << 20})};
  for (Strategy strategy : {Strategy::kLayerwise, Strategy::kMegatronLpt, Strategy::kDistOpt}) {
    LayoutOptions options;
    options.muon_strategy = strategy;
    options.dp = 1 << 20;  // 2^20 ranks x (2^40 + 2^20) elements > 2^60
    EXPECT_THAT(ComputeFullParamLayout(params, options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("is beyond what a buffer can address")));
    options.dp = 2;
    options.expert_dp = 1 << 20;
    EXPECT_THAT(ComputeFullParamLayout(params, options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp 1048576 x")));
  }
  // A small model at a huge dp is fine: mostly padding, but addressable.
  LayoutOptions options;
  options.dp = 1 << 20;
  EXPECT_OK(ComputeFullParamLayout({Muon("w", 64, 64), Adam("b", {64})}, options).status());
}

TEST(LayoutTest, ScalarParamHasOneElement) {
  ParamSpec scalar = Adam("s", {});
  EXPECT_EQ(scalar.numel(), 1);
  const PerBufferParamLayout b = PlanOne({scalar}, LayoutOptions());
  EXPECT_EQ(b.unpadded_numel, 1);
}

TEST(InvariantCheckerTest, DetectsBrokenLayouts) {
  const std::vector<ParamSpec> params = Uniform(4, 16, 16);
  LayoutOptions options;
  options.dp = 2;
  ASSERT_OK_AND_ASSIGN(FullParamLayout layout, ComputeFullParamLayout(params, options));
  FullParamLayout overlap = layout;
  overlap.buffers[0].params[1].start = overlap.buffers[0].params[0].start + 64;
  overlap.buffers[0].params[1].end = overlap.buffers[0].params[1].start + 256;
  EXPECT_FALSE(testing::CheckLayoutInvariants(overlap, params, options).ok());
  FullParamLayout crossing = layout;
  crossing.buffers[0].buckets[0].shard_size /= 2;
  EXPECT_FALSE(testing::CheckLayoutInvariants(crossing, params, options).ok());
  FullParamLayout missing = layout;
  missing.buffers[0].params.pop_back();
  EXPECT_FALSE(testing::CheckLayoutInvariants(missing, params, options).ok());
}

TEST(MetricsTest, CountsPaddingImbalanceAndOwnership) {
  // 3 equal params over 2 shards: shard 0 holds two, shard 1 one.
  LayoutOptions options;
  options.dp = 2;
  const std::vector<ParamSpec> params = Uniform(3, 16, 16);
  const PerBufferParamLayout b = PlanOne(params, options);
  const BufferMetrics m = ComputeBufferMetrics(b, params);
  EXPECT_EQ(m.buckets, 1);
  EXPECT_EQ(m.padded_numel, 1024);
  // Equal bits: each side is one correctly rounded division with the same exact quotient; what
  // comes before it is exact (integer numel sums; NsCost 16^3, shares cost * 256 / 256, and their
  // sums are integers far below 2^53).
  EXPECT_EQ(m.padding_fraction, (1024.0 - 768) / 768);
  std::multiset<int64_t> numel(m.rank_numel.begin(), m.rank_numel.end());
  EXPECT_EQ(numel, std::multiset<int64_t>({256, 512}));
  EXPECT_EQ(m.numel_imbalance, 512.0 / 384);
  EXPECT_EQ(m.ns_cost_imbalance, 2.0 / 1.5);
  ASSERT_EQ(m.bucket_ns_cost_imbalance.size(), 1u);
  EXPECT_EQ(m.bucket_ns_cost_imbalance[0], 2.0 / 1.5);
}

}  // namespace
}  // namespace orthoshard::layout
