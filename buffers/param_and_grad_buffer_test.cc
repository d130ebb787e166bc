#include "buffers/param_and_grad_buffer.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layout/layout.h"

namespace orthoshard::buffers {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

at::Tensor Leaf(std::vector<int64_t> shape, at::ScalarType dtype, float first) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor t = at::arange(n, at::kFloat).add(first).view(shape).to(dtype);
  t.set_requires_grad(true);
  return t;
}

// dp = 2, bf16 params with fp32 grads, two buckets with padding:
//   bucket 0 [0, 20) shards of 10: a [3,4] at [0, 12), b [5] at [12, 17)
//   bucket 1 [20, 32) shards of 6: c [2,3] at [20, 26)
// Model param 1 belongs to another buffer.
layout::PerBufferParamLayout HandLayout() {
  layout::PerBufferParamLayout layout;
  layout.key = {DType::kBFloat16, DType::kFloat32, false, true};
  layout.dp = 2;
  layout.params = {{"a", 0, 0, 12, 0}, {"b", 2, 12, 17, 0}, {"c", 3, 20, 26, 1}};
  layout.buckets = {{0, 20, 10}, {20, 32, 6}};
  layout.unpadded_numel = 23;
  return layout;
}

std::vector<at::Tensor> HandParams() {
  return {Leaf({3, 4}, at::kBFloat16, 1), Leaf({7}, at::kFloat, 0), Leaf({5}, at::kBFloat16, 20),
          Leaf({2, 3}, at::kBFloat16, 40)};
}

TEST(ParamAndGradBufferTest, CopiesValuesInAndParamsAliasTheBuffer) {
  std::vector<at::Tensor> params = HandParams();
  const std::vector<at::Tensor> original = {params[0].detach().clone(), params[2].detach().clone(),
                                            params[3].detach().clone()};
  const void* other_before = params[1].data_ptr();
  ASSERT_OK_AND_ASSIGN(auto buffer, ParamAndGradBuffer::Create(HandLayout(), params));
  EXPECT_EQ(buffer->param_data().scalar_type(), at::kBFloat16);
  EXPECT_EQ(buffer->grad_data().scalar_type(), at::kFloat);
  EXPECT_EQ(buffer->param_data().numel(), 32);

  const int64_t starts[] = {0, 12, 20};
  const int model_index[] = {0, 2, 3};
  for (int i = 0; i < 3; ++i) {
    const at::Tensor& p = params[model_index[i]];
    EXPECT_TRUE(p.is_leaf());
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.equal(original[i])) << "param " << i;
    EXPECT_EQ(p.data_ptr(), static_cast<char*>(buffer->param_data().data_ptr()) + 2 * starts[i]);
    EXPECT_EQ(p.grad().data_ptr(),
              static_cast<char*>(buffer->grad_data().data_ptr()) + 4 * starts[i]);
    EXPECT_EQ(p.grad().sizes(), p.sizes());
    EXPECT_TRUE(buffer->Param(i).is_same(p));
  }
  EXPECT_EQ(params[1].data_ptr(), other_before);
  // Padding stays zero.
  EXPECT_EQ(buffer->param_data().narrow(0, 17, 3).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(buffer->param_data().narrow(0, 26, 6).abs().sum().item<float>(), 0.0f);

  {
    c10::NoGradGuard no_grad;
    params[2].mul_(2);  // writing the param writes the buffer
  }
  EXPECT_TRUE(buffer->param_data().narrow(0, 12, 5).equal(original[1].mul(2)));
  buffer->param_data().narrow(0, 20, 6).fill_(-1);  // writing the buffer writes the param
  EXPECT_TRUE(params[3].equal(at::full({2, 3}, -1, at::kBFloat16)));
  buffer->grad_data().narrow(0, 0, 12).fill_(5);
  EXPECT_TRUE(params[0].grad().equal(at::full({3, 4}, 5, at::kFloat)));
}

TEST(ParamAndGradBufferTest, BackwardAccumulatesIntoGradData) {
  std::vector<at::Tensor> params = HandParams();
  ASSERT_OK_AND_ASSIGN(auto buffer, ParamAndGradBuffer::Create(HandLayout(), params));
  const at::Tensor weight = at::arange(12, at::kFloat).view({3, 4});
  auto loss = [&] {
    return params[0]
        .to(at::kFloat)
        .mul(weight)
        .sum()
        .add(params[2].to(at::kFloat).mul(3).sum())
        .add(params[3].to(at::kFloat).pow(2).sum());
  };
  const void* grad_ptr = buffer->grad_data().data_ptr();
  loss().backward();
  EXPECT_TRUE(buffer->GradView(0).equal(weight));
  EXPECT_TRUE(buffer->GradView(1).equal(at::full({5}, 3, at::kFloat)));
  EXPECT_TRUE(buffer->GradView(2).equal(params[3].detach().to(at::kFloat).mul(2)));
  EXPECT_EQ(params[0].grad().data_ptr(), grad_ptr);

  loss().backward();  // accumulates in place
  EXPECT_TRUE(buffer->GradView(0).equal(weight.mul(2)));
  EXPECT_TRUE(buffer->GradView(1).equal(at::full({5}, 6, at::kFloat)));
  EXPECT_EQ(buffer->grad_data().narrow(0, 17, 3).abs().sum().item<float>(), 0.0f);

  buffer->ZeroGrads();
  EXPECT_EQ(buffer->grad_data().data_ptr(), grad_ptr);
  EXPECT_EQ(buffer->grad_data().abs().sum().item<float>(), 0.0f);
  loss().backward();
  EXPECT_TRUE(params[0].grad().equal(weight));
  EXPECT_EQ(params[0].grad().data_ptr(), grad_ptr);
}

TEST(ParamAndGradBufferTest, BucketAndShardViewsMatchTheLayout) {
  std::vector<at::Tensor> params = HandParams();
  const layout::PerBufferParamLayout layout = HandLayout();
  ASSERT_OK_AND_ASSIGN(auto buffer, ParamAndGradBuffer::Create(layout, params));
  ASSERT_EQ(buffer->num_buckets(), 2);
  EXPECT_THAT(buffer->BucketParams(0), ElementsAre(0, 1));
  EXPECT_THAT(buffer->BucketParams(1), ElementsAre(2));
  ASSERT_EQ(buffer->bucket_groups().size(), 2u);
  EXPECT_THAT(buffer->bucket_groups()[1].buckets, ElementsAre(1));
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(buffer->GradBucket(b).numel(), layout.buckets[b].numel());
    EXPECT_EQ(buffer->ParamBucket(b).data_ptr(),
              static_cast<char*>(buffer->param_data().data_ptr()) + 2 * layout.buckets[b].start);
    for (int r = 0; r < 2; ++r) {
      const auto [begin, end] = layout.ShardRange(b, r);
      EXPECT_EQ(buffer->GradShard(b, r).numel(), end - begin);
      EXPECT_EQ(buffer->GradShard(b, r).data_ptr(),
                static_cast<char*>(buffer->grad_data().data_ptr()) + 4 * begin);
      EXPECT_EQ(buffer->ParamShard(b, r).data_ptr(),
                static_cast<char*>(buffer->param_data().data_ptr()) + 2 * begin);
    }
  }
  // Rank 1's shard of bucket 0 holds a's last two elements and all of b.
  at::Tensor shard = buffer->ParamShard(0, 1);
  EXPECT_TRUE(shard.narrow(0, 0, 2).equal(params[0].detach().view({-1}).narrow(0, 10, 2)));
  EXPECT_TRUE(shard.narrow(0, 2, 5).equal(params[2].detach()));

  std::vector<at::Tensor> more = HandParams();
  ASSERT_OK_AND_ASSIGN(auto grouped, ParamAndGradBuffer::Create(layout, more, {2}));
  ASSERT_EQ(grouped->bucket_groups().size(), 1u);
  EXPECT_THAT(grouped->bucket_groups()[0].buckets, ElementsAre(0, 1));
}

TEST(ParamAndGradBufferTest, WorksOnComputedLayouts) {
  std::vector<layout::ParamSpec> specs = {
      {"embed", {50, 16}, DType::kBFloat16, layout::ParamRole::kAdam},
      {"w1", {16, 32}, DType::kBFloat16, layout::ParamRole::kMuon},
      {"w2", {32, 16}, DType::kBFloat16, layout::ParamRole::kMuon},
      {"norm", {16}, DType::kBFloat16, layout::ParamRole::kAdam},
  };
  layout::LayoutOptions options;
  options.dp = 4;
  options.bucket_size = 600;
  ASSERT_OK_AND_ASSIGN(layout::FullParamLayout full,
                       layout::ComputeFullParamLayout(specs, options));
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < specs.size(); ++i) {
    params.push_back(Leaf(specs[i].shape, at::kBFloat16, static_cast<float>(i)));
  }
  std::vector<at::Tensor> original;
  for (const at::Tensor& p : params) original.push_back(p.detach().clone());
  std::vector<std::unique_ptr<ParamAndGradBuffer>> buffers;
  for (const layout::PerBufferParamLayout& l : full.buffers) {
    ASSERT_OK_AND_ASSIGN(auto buffer, ParamAndGradBuffer::Create(l, params));
    for (size_t i = 0; i < l.params.size(); ++i) {
      const layout::ParamPlacement& p = l.params[i];
      EXPECT_EQ(params[p.param_index].data_ptr(), buffer->ParamView(i).data_ptr()) << p.name;
      EXPECT_TRUE(params[p.param_index].equal(original[p.param_index])) << p.name;
      const int owner = l.OwnerOf(p);
      if (owner >= 0) {
        const auto [begin, end] = l.ShardRange(p.bucket, owner);
        EXPECT_TRUE(buffer->ParamShard(p.bucket, owner)
                        .narrow(0, p.start - begin, p.numel())
                        .equal(original[p.param_index].view({-1})))
            << p.name;
      }
    }
    buffers.push_back(std::move(buffer));
  }
  at::Tensor loss = params[0].to(at::kFloat).sum();
  for (size_t i = 1; i < params.size(); ++i) loss = loss.add(params[i].to(at::kFloat).sum());
  loss.backward();
  for (const auto& buffer : buffers) {
    int64_t placed = 0;
    for (const auto& p : buffer->layout().params) placed += p.numel();
    EXPECT_EQ(buffer->grad_data().sum().item<float>(), static_cast<float>(placed));
  }
}

// Sharded residency, rank 1 of HandLayout: shard 1 of bucket 0 is [10, 20) (the last 2 elements of
// 'a' and all of 'b'), of bucket 1 [26, 32) (padding only).
TEST(ParamAndGradBufferTest, ShardedKeepsOnlyTheRanksShardsAndFullBucketsAreTransient) {
  std::vector<at::Tensor> params = HandParams();
  const at::Tensor a = params[0].detach().clone(), b = params[2].detach().clone();
  BufferOptions options;
  options.residency = Residency::kSharded;
  options.rank = 1;
  ASSERT_OK_AND_ASSIGN(auto buffer, ParamAndGradBuffer::Create(HandLayout(), params, options));
  EXPECT_FALSE(buffer->param_data().defined());
  EXPECT_FALSE(buffer->grad_data().defined());
  // Persistent: 10 + 6 shard elements, bf16 params and fp32 grads.
  BufferMemory memory = buffer->memory();
  EXPECT_EQ(memory.param_bytes, 16 * 2);
  EXPECT_EQ(memory.grad_bytes, 16 * 4);
  EXPECT_EQ(memory.transient_bytes, 0);
  EXPECT_TRUE(buffer->ParamShard(0, 1).narrow(0, 0, 2).equal(a.view({-1}).narrow(0, 10, 2)));
  EXPECT_TRUE(buffer->ParamShard(0, 1).narrow(0, 2, 5).equal(b));
  EXPECT_EQ(buffer->ParamShard(1, 1).abs().sum().item<float>(), 0.0f);
  // The params and their grads alias the released buckets: no memory of their own.
  for (int i : {0, 2, 3}) {
    EXPECT_EQ(params[i].storage().nbytes(), 0u) << i;
    EXPECT_EQ(params[i].grad().storage().nbytes(), 0u) << i;
  }
  EXPECT_FALSE(buffer->params_materialized(0));

  // Materialized, a bucket's memory is where the params and grads point; a gather would fill it.
  buffer->MaterializeParams(0);
  buffer->MaterializeGrads(0);
  EXPECT_EQ(buffer->memory().transient_bytes, 20 * 2 + 20 * 4);
  EXPECT_EQ(params[0].data_ptr(), buffer->ParamBucket(0).data_ptr());
  EXPECT_EQ(params[0].grad().data_ptr(), buffer->GradBucket(0).data_ptr());
  EXPECT_EQ(buffer->GradBucket(0).abs().sum().item<float>(), 0.0f);  // zeroed
  buffer->ParamBucket(0).narrow(0, 0, 12).copy_(a.view({-1}));
  buffer->ParamBucket(0).narrow(0, 12, 5).copy_(b);
  params[0].to(at::kFloat).sum().add(params[2].to(at::kFloat).mul(2).sum()).backward();
  EXPECT_TRUE(buffer->GradView(0).equal(at::ones({3, 4}, at::kFloat)));
  EXPECT_TRUE(buffer->GradView(1).equal(at::full({5}, 2, at::kFloat)));

  // Released and materialized again: same storage objects, fresh zeroed grads, peak kept.
  buffer->ReleaseParams(0);
  buffer->ReleaseGrads(0);
  EXPECT_EQ(buffer->memory().transient_bytes, 0);
  EXPECT_EQ(params[0].storage().nbytes(), 0u);
  EXPECT_EQ(buffer->transient().peak(), 20 * 2 + 20 * 4);
  buffer->MaterializeGrads(0);
  EXPECT_EQ(params[0].grad().storage().nbytes(), 20u * 4);
  EXPECT_EQ(params[0].grad().abs().sum().item<float>(), 0.0f);
  buffer->GradShard(0, 1).fill_(3);
  buffer->ZeroGrads();
  EXPECT_EQ(buffer->GradShard(0, 1).abs().sum().item<float>(), 0.0f);
  buffer->ReleaseGrads(0);

  options.rank = 2;
  EXPECT_THAT(ParamAndGradBuffer::Create(HandLayout(), HandParams(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sharded residency for rank 2, expected a rank in [0, 2)")));
}

TEST(ParamAndGradBufferTest, RejectsMismatchedParamsAndLayouts) {
  std::vector<at::Tensor> params = HandParams();
  params[2] = Leaf({5}, at::kFloat, 0);
  EXPECT_THAT(ParamAndGradBuffer::Create(HandLayout(), params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'b' has dtype Float, the buffer holds BFloat16")));
  params = HandParams();
  params[3] = Leaf({7}, at::kBFloat16, 0);
  EXPECT_THAT(ParamAndGradBuffer::Create(HandLayout(), params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'c' has 7 elements, the layout places 6")));
  params = HandParams();
  params.resize(3);
  EXPECT_THAT(ParamAndGradBuffer::Create(HandLayout(), params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'c': param_index 3 is outside the 3 model params")));
  params = HandParams();
  layout::PerBufferParamLayout bad = HandLayout();
  bad.buckets[1].shard_size = 5;
  EXPECT_THAT(ParamAndGradBuffer::Create(bad, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bucket 1 is [20, 32) with shard_size 5")));
  bad = HandLayout();
  bad.params[1].end = 21;
  EXPECT_THAT(ParamAndGradBuffer::Create(bad, params),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'b': [12, 21) is not inside its bucket 0 [0, 20)")));
  EXPECT_THAT(ParamAndGradBuffer::Create(HandLayout(), params, {0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("buckets_per_group must be at least 1, got 0")));
  // Nothing was modified by the rejected calls.
  EXPECT_TRUE(params[0].grad().defined() == false);
}

}  // namespace
}  // namespace orthoshard::buffers
