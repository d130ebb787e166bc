// Property test: thousands of seeded random models, every strategy, random dp / expert_dp /
// bucket sizes; every layout must satisfy every structural invariant (testing/invariants.h).
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "layout/layout.h"
#include "layout/metrics.h"
#include "layout/testing/invariants.h"

namespace orthoshard::layout {
namespace {

using ::orthoshard::testing::IsOk;

constexpr int kModels = 5000;

// Slack for ns_cost_imbalance comparisons, relative to `imbalance`. A rank's cost sums its
// params' shares cost * overlap / numel (2 roundings each, at most num_params - 1 additions of
// positive terms): within (num_params + 1) u of exact, u = 2^-53. MaxOverMean's dp - 1 additions
// and 2 divisions add (dp + 1) u. So a computed imbalance is within (num_params + dp + 2) u of its
// exact value to first order, and two of them (two layouts, or one against the exact bound 1)
// within twice that; doubled again for the higher-order terms.
double ImbalanceSlack(double imbalance, size_t num_params, int dp) {
  return 4.0 * static_cast<double>(num_params + dp + 2) * 0x1p-53 * imbalance;
}

class PropertyTest : public ::testing::TestWithParam<Strategy> {};

TEST_P(PropertyTest, RandomModelsSatisfyEveryInvariant) {
  static constexpr int kDps[] = {1, 2, 3, 4, 5, 7, 8, 16, 64, 100};
  for (uint64_t seed = 0; seed < kModels; ++seed) {
    const std::vector<ParamSpec> params = testing::RandomModel(seed, 60);
    std::mt19937_64 rng(seed * 7919 + 1);
    auto pick = [&](int n) { return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng)); };
    LayoutOptions options;
    options.dp = kDps[pick(std::size(kDps))];
    options.expert_dp = pick(3) == 0 ? 0 : kDps[pick(std::size(kDps))];
    options.muon_strategy = GetParam();
    int64_t total = 0;
    for (const ParamSpec& p : params) total += p.numel();
    switch (pick(4)) {
      case 0:
        options.bucket_size = std::nullopt;
        break;
      case 1:
        options.bucket_size = 1;
        break;
      default:
        options.bucket_size = 1 + std::uniform_int_distribution<int64_t>(0, total)(rng);
    }
    if (pick(5) == 0) options.grad_dtype = std::nullopt;
    if (pick(3) == 0) options.min_buckets = 1 + pick(8);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " dp " << options.dp << " expert_dp "
                                      << options.expert_dp << " min_buckets "
                                      << options.min_buckets);
    absl::StatusOr<FullParamLayout> layout = ComputeFullParamLayout(params, options);
    ASSERT_THAT(layout, IsOk());
    if (options.min_buckets > 0) {  // the rule only ever adds buckets
      LayoutOptions without = options;
      without.min_buckets = 0;
      ASSERT_OK_AND_ASSIGN(const FullParamLayout plain, ComputeFullParamLayout(params, without));
      ASSERT_EQ(plain.buffers.size(), layout->buffers.size());
      for (size_t i = 0; i < plain.buffers.size(); ++i) {
        ASSERT_GE(layout->buffers[i].buckets.size(), plain.buffers[i].buckets.size());
      }
    }
    ASSERT_THAT(testing::CheckLayoutInvariants(*layout, params, options), IsOk());
    for (const PerBufferParamLayout& buffer : layout->buffers) {
      const BufferMetrics m = ComputeBufferMetrics(buffer, params);
      int64_t owned = 0;
      for (int64_t n : m.rank_numel) owned += n;
      ASSERT_EQ(owned, buffer.unpadded_numel);
      ASSERT_GE(m.padding_fraction, 0);
      // max >= mean exactly; the computed ratio may fall below 1 by its roundings only.
      ASSERT_GE(m.ns_cost_imbalance, 1 - ImbalanceSlack(1.0, params.size(), buffer.dp));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, PropertyTest,
                         ::testing::Values(Strategy::kDistOpt, Strategy::kMegatronLpt,
                                           Strategy::kLayerwise),
                         [](const ::testing::TestParamInfo<Strategy>& info) {
                           return std::string(StrategyName(info.param));
                         });

// With one bucket (and no shared embedding) both shard-aligned strategies pack the same chunk, and
// the layer-wise packer keeps Megatron's packing as a fallback: it never pads more.
TEST(PropertyTest, LayerwiseSingleBucketPadsNoMoreThanMegatron) {
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    std::vector<ParamSpec> params = testing::RandomModel(seed, 40);
    for (ParamSpec& p : params) p.shared_embedding = false;
    for (int dp : {2, 3, 8, 64}) {
      LayoutOptions options;
      options.dp = dp;
      options.bucket_size = std::nullopt;
      options.muon_strategy = Strategy::kLayerwise;
      ASSERT_OK_AND_ASSIGN(FullParamLayout ours, ComputeFullParamLayout(params, options));
      options.muon_strategy = Strategy::kMegatronLpt;
      ASSERT_OK_AND_ASSIGN(FullParamLayout megatron, ComputeFullParamLayout(params, options));
      ASSERT_EQ(ours.buffers.size(), megatron.buffers.size());
      for (size_t i = 0; i < ours.buffers.size(); ++i) {
        EXPECT_LE(ours.buffers[i].numel(), megatron.buffers[i].numel())
            << "seed " << seed << " dp " << dp << " buffer " << ours.buffers[i].key.ToString();
      }
    }
  }
}

}  // namespace
}  // namespace orthoshard::layout
