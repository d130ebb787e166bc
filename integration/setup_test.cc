// What a config implies for the libraries (setup.h's OptimizerConfigOf, LayoutOptionsOf,
// DdpConfigOf): every mapped field reaches its option field with the config's value, and every
// --dist mode sets what its row of kDistModes says. What each option then does to the numerics is
// checked against PyTorch by the optimizers' oracle tests (optimizers/oracle_test.cc: momentum,
// Nesterov, scale rules, Newton-Schulz steps and coefficients, betas, eps, weight decay).
#include "integration/setup.h"

#include <ATen/ops/empty.h>

#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "common/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/ns_schedule.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using model::ModelParam;

// A config whose every field the mappings read differs from TrainerConfig's default.
TrainerConfig Distinctive() {
  TrainerConfig c;
  c.lr = 0.125;
  c.adam_beta1 = 0.25;
  c.adam_beta2 = 0.375;
  c.adam_eps = 0.5;
  c.weight_decay = 0.625;
  c.adamw_fused = true;
  c.muon_lr = 0.75;
  c.muon_weight_decay = 0.875;
  c.muon_momentum = 0.0625;
  c.muon_nesterov = false;
  c.muon_scale_rule = optimizers::MuonScaleRule::kSpectral;
  c.muon_extra_scale = 1.5;
  c.muon_ns_steps = 7;
  c.muon_batched_ns = true;
  c.muon_ns_dtype = optimizers::NsDType::kFloat32;
  c.muon_ns_form = NsForm::kDirect;
  c.muon_ns_coefficients = "2,-1.5,0.5";
  c.max_grad_norm = 2.5;
  c.clip_mode = optimizers::ClipMode::kExcludeMuon;
  c.log_params_norm = true;
  c.log_num_zeros_in_grad = true;
  c.no_weight_decay = " embedding* , ,output_layer*";
  c.fsdp_grad_accum = FsdpGradAccum::kSharded;
  c.fsdp_grad_syncs_in_flight = 3;
  c.schedule = optimizers::ScheduleKind::kWsd;
  c.steps = 50;
  c.warmup_steps = 7;
  c.decay_steps = 9;
  c.min_lr_ratio = 0.3;
  c.bucket_elems = 123;
  c.target_buckets = 5;
  c.max_bucket_elems = 4567;
  c.bucket_padding = 0.01;
  c.min_buckets = 6;
  c.max_bucket_padding = 0.2;
  c.grad_reduce_in_fp32 = false;
  c.overlap_grad_reduce = false;
  c.reshard_after_forward = false;
  c.prefetch_params = false;
  return c;
}

TEST(Setup, EveryOptimizerFieldReachesTheOptimizerConfig) {
  const TrainerConfig c = Distinctive();
  ASSERT_OK_AND_ASSIGN(const optimizers::ChainedConfig o, OptimizerConfigOf(c));
  EXPECT_EQ(o.adamw.lr, c.lr);
  EXPECT_EQ(o.adamw.beta1, c.adam_beta1);
  EXPECT_EQ(o.adamw.beta2, c.adam_beta2);
  EXPECT_EQ(o.adamw.eps, c.adam_eps);
  EXPECT_EQ(o.adamw.weight_decay, c.weight_decay);
  EXPECT_EQ(o.adamw.fused, c.adamw_fused);
  EXPECT_EQ(o.muon.lr, c.muon_lr);
  EXPECT_EQ(o.muon.weight_decay, c.muon_weight_decay);
  EXPECT_EQ(o.muon.momentum, c.muon_momentum);
  EXPECT_EQ(o.muon.nesterov, c.muon_nesterov);
  EXPECT_EQ(o.muon.scale_rule, c.muon_scale_rule);
  EXPECT_EQ(o.muon.extra_scale, c.muon_extra_scale);
  EXPECT_EQ(o.muon.ns.ns_steps, c.muon_ns_steps);
  EXPECT_EQ(o.muon.ns.batched, c.muon_batched_ns);
  EXPECT_EQ(o.muon.ns.dtype, c.muon_ns_dtype);
  EXPECT_FALSE(o.muon.ns.gram);  // --muon_ns_form=direct
  optimizers::NewtonSchulzOptions ns;
  ASSERT_OK(optimizers::SetNsSchedule(c.muon_ns_coefficients, &ns));
  EXPECT_EQ(o.muon.ns.coefficients, ns.coefficients);
  EXPECT_EQ(o.max_grad_norm, c.max_grad_norm);
  EXPECT_EQ(o.clip_mode, c.clip_mode);
  EXPECT_EQ(o.params_norm, c.log_params_norm);
  EXPECT_EQ(o.count_zero_grads, c.log_num_zeros_in_grad);
  EXPECT_THAT(o.no_weight_decay_patterns, ElementsAre("embedding*", "output_layer*"));
  EXPECT_EQ(o.schedule.kind, c.schedule);
  EXPECT_EQ(o.schedule.warmup_steps, c.warmup_steps);
  EXPECT_EQ(o.schedule.total_steps, c.steps);
  EXPECT_EQ(o.schedule.decay_steps, c.decay_steps);
  EXPECT_EQ(o.schedule.min_lr_ratio, c.min_lr_ratio);
}

TEST(Setup, DerivedOptimizerFields) {
  TrainerConfig c;
  c.steps = 10;
  c.warmup_steps = 20;  // capped at --steps
  ASSERT_OK_AND_ASSIGN(optimizers::ChainedConfig o, OptimizerConfigOf(c));
  EXPECT_EQ(o.schedule.warmup_steps, 10);
  EXPECT_EQ(o.schedule.decay_steps, 2);  // 0: steps / 5
  EXPECT_FALSE(o.muon.ns.gram);          // auto with the bf16 iteration: direct
  c.muon_ns_dtype = optimizers::NsDType::kFloat32;
  ASSERT_OK_AND_ASSIGN(o, OptimizerConfigOf(c));
  EXPECT_TRUE(o.muon.ns.gram);  // auto with the fp32 iteration: Gram
  c.muon_ns_coefficients = "1,2";
  EXPECT_THAT(OptimizerConfigOf(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'1,2'")));
}

TEST(Setup, EveryLayoutAndDdpFieldReachesItsOptions) {
  const TrainerConfig c = Distinctive();
  EXPECT_EQ(LayoutOptionsOf(TrainerConfig(), 2).bucket_size, kDefaultBucketElems);  // 0 = auto
  const layout::LayoutOptions l = LayoutOptionsOf(c, 3);
  EXPECT_EQ(l.dp, 3);
  EXPECT_EQ(l.bucket_size, c.bucket_elems);
  EXPECT_EQ(l.target_buckets, c.target_buckets);
  EXPECT_EQ(l.max_bucket_size, c.max_bucket_elems);
  EXPECT_EQ(l.padding_tolerance, c.bucket_padding);
  EXPECT_EQ(l.min_buckets, c.min_buckets);
  EXPECT_EQ(l.max_padding_tolerance, c.max_bucket_padding);
  EXPECT_EQ(l.grad_dtype, std::nullopt);  // --grad_reduce_in_fp32=false: the params' dtype
  const ddp::DdpConfig d = DdpConfigOf(c);
  EXPECT_EQ(d.grad_reduce_in_fp32, c.grad_reduce_in_fp32);
  EXPECT_EQ(d.overlap_grad_reduce, c.overlap_grad_reduce);
  EXPECT_EQ(d.reshard_after_forward, c.reshard_after_forward);
  EXPECT_EQ(d.prefetch, c.prefetch_params);
  EXPECT_EQ(d.grad_accumulation, ddp::GradAccumulation::kSharded);
  EXPECT_EQ(d.grad_syncs_in_flight, c.fsdp_grad_syncs_in_flight);
  // Counts beyond an int are "as many as there can be".
  TrainerConfig big;
  big.min_buckets = int64_t{1} << 40;
  EXPECT_EQ(LayoutOptionsOf(big, 2).min_buckets, std::numeric_limits<int>::max());
  EXPECT_EQ(LayoutOptionsOf(TrainerConfig(), 2).grad_dtype, DType::kFloat32);
}

// Each --dist mode's row of kDistModes, as the libraries see it.
TEST(Setup, EveryDistModeSetsWhatItsRowSays) {
  for (const DistModeSpec& mode : kDistModes) {
    TrainerConfig c;
    c.dist = mode.value;
    const ddp::DdpConfig d = DdpConfigOf(c);
    const layout::LayoutOptions l = LayoutOptionsOf(c, 2);
    SCOPED_TRACE(mode.name);
    EXPECT_EQ(l.muon_strategy, mode.muon_strategy);
    EXPECT_EQ(d.grad_sync, mode.sharded_step ? buffers::GradSync::kReduceScatter
                                             : buffers::GradSync::kAllReduce);
    EXPECT_EQ(d.residency,
              mode.sharded_params ? buffers::Residency::kSharded : buffers::Residency::kFull);
    EXPECT_EQ(d.overlap_param_gather, mode.sharded_step);  // --overlap_param_gather is on
  }
  TrainerConfig c;
  c.overlap_param_gather = false;
  EXPECT_FALSE(DdpConfigOf(c).overlap_param_gather);
  const DistModeSpec& distopt = SpecOf(DistMode::kDistOpt);
  EXPECT_EQ(distopt.muon_strategy, layout::Strategy::kDistOpt);
  EXPECT_TRUE(SpecOf(DistMode::kFsdp).sharded_params);
  EXPECT_FALSE(SpecOf(DistMode::kReplicated).sharded_step);
}

// The layout's view of `params`: the hidden matrices routed to Muon, every other param to AdamW.
std::vector<layout::ParamSpec> SpecsOf(const std::vector<ModelParam>& params) {
  std::vector<layout::ParamSpec> specs;
  for (const ModelParam& p : params) {
    layout::ParamSpec spec;
    spec.name = p.name;
    spec.shape = std::vector<int64_t>(p.tensor.sizes().begin(), p.tensor.sizes().end());
    spec.role = p.kind == model::ParamKind::kHidden ? layout::ParamRole::kMuon
                                                     : layout::ParamRole::kAdam;
    specs.push_back(std::move(spec));
  }
  return specs;
}

// A GPT block whose fc1 holds as much as qkv + proj (4h^2 = 3h^2 + h^2, the classic 4h MLP): with
// fsdp's automatic bucket size (half a block) the layer-wise layout at dp 2 puts every block in
// two or more bucket groups, each Muon matrix whole in one shard; 64 Ki buckets grown by
// --target_buckets would hold whole blocks (the shallow model's transient would then be layers).
TEST(Setup, FsdpBucketsSplitEveryBlock) {
  constexpr int64_t h = 64, kBlocks = 3;
  std::vector<ModelParam> params;
  auto add = [&](std::string name, std::vector<int64_t> shape, model::ParamKind kind, int layer) {
    ModelParam p;
    p.name = std::move(name);
    p.tensor = at::empty(shape);
    p.kind = kind;
    p.layer = layer;
    params.push_back(std::move(p));
  };
  add("embedding", {256, h}, model::ParamKind::kEmbedding, 0);
  for (int l = 1; l <= kBlocks; ++l) {
    const std::string b = absl::StrCat("layers.", l, ".");
    add(b + "norm1", {h}, model::ParamKind::kNorm, l);
    add(b + "qkv", {3 * h, h}, model::ParamKind::kHidden, l);
    add(b + "proj", {h, h}, model::ParamKind::kHidden, l);
    add(b + "norm2", {h}, model::ParamKind::kNorm, l);
    add(b + "fc1", {4 * h, h}, model::ParamKind::kHidden, l);
    add(b + "fc2", {h, 4 * h}, model::ParamKind::kHidden, l);
  }
  add("final_norm", {h}, model::ParamKind::kNorm, kBlocks + 1);
  add("output", {256, h}, model::ParamKind::kOutput, kBlocks + 1);  // not a block: not counted
  EXPECT_EQ(FsdpBucketElems(params), (12 * h * h + 2 * h) / 2);

  const std::vector<layout::ParamSpec> specs = SpecsOf(params);
  TrainerConfig c;
  c.dist = DistMode::kFsdp;
  layout::LayoutOptions options = LayoutOptionsOf(c, 2);
  options.bucket_size = FsdpBucketElems(params);
  options.target_buckets = 0;
  ASSERT_OK_AND_ASSIGN(const layout::FullParamLayout plan,
                       layout::ComputeFullParamLayout(specs, options));
  for (int l = 1; l <= kBlocks; ++l) {
    std::set<std::pair<int, int>> buckets;  // (buffer, bucket) of the block's matrices
    for (const char* m : {"qkv", "proj", "fc1", "fc2"}) {
      const auto [b, p] = plan.Find(absl::StrCat("layers.", l, ".", m));
      ASSERT_NE(p, nullptr);
      EXPECT_GE(plan.buffers[b].OwnerOf(*p), 0) << p->name << " crosses a shard boundary";
      buckets.insert({b, p->bucket});
    }
    EXPECT_GE(buckets.size(), 2u) << "block " << l;
  }
}

// TinyLlama (on the meta device: shapes, no memory) under fsdp at dp 2: its untied embedding and
// head ([32000, 2048], 65.5M elements each) are larger than fsdp's bucket (half a block, 22.0M
// elements), so each gets a bucket of its own in the AdamW buffer; the blocks' norm gains, which
// every block's forward gathers, then share a bucket with neither (before, every gain shared the
// embedding's bucket, and each block's forward gathered the embedding too).
TEST(Setup, FsdpGivesAParamOfTheBucketSizeABucketOfItsOwn) {
  ASSERT_OK_AND_ASSIGN(const model::GptConfig llama, model::GptPreset("tinyllama-1.1b"));
  ASSERT_OK_AND_ASSIGN(const model::Gpt gpt, model::Gpt::CreateUninitialized(
                                                 llama, at::kFloat, at::Device(at::kMeta)));
  const std::vector<ModelParam>& params = gpt.params();
  const std::vector<layout::ParamSpec> specs = SpecsOf(params);
  TrainerConfig c;
  c.dist = DistMode::kFsdp;
  layout::LayoutOptions options = LayoutOptionsOf(c, 2);
  EXPECT_TRUE(options.isolate_large_params);
  options.bucket_size = FsdpBucketElems(params);  // as Build sets it for --bucket_elems=0
  options.target_buckets = 0;
  EXPECT_EQ(*options.bucket_size, 22022144);  // (qkv, proj, fc1, fc2 of a block + 2 gains) / 2
  ASSERT_OK_AND_ASSIGN(const layout::FullParamLayout plan,
                       layout::ComputeFullParamLayout(specs, options));
  const auto [buffer, embedding] = plan.Find("embedding.weight");
  ASSERT_NE(embedding, nullptr);
  const auto [head_buffer, head] = plan.Find("output_layer.weight");
  ASSERT_NE(head, nullptr);
  ASSERT_EQ(head_buffer, buffer);
  int gains = 0;
  for (const layout::ParamPlacement& p : plan.buffers[buffer].params) {
    if (&p != embedding) EXPECT_NE(p.bucket, embedding->bucket) << p.name;
    if (&p != head) EXPECT_NE(p.bucket, head->bucket) << p.name;
    gains += absl::StrContains(p.name, "norm") ? 1 : 0;
  }
  EXPECT_EQ(gains, 2 * llama.num_layers + 1);
}

// --route is planned against the model's params before launch (on the meta device), as Build
// plans it: a non-matrix sent to Muon, and an entry that matches no param, are refused.
TEST(Setup, RoutingIsCheckedAgainstTheModelBeforeLaunch) {
  TrainerConfig c;
  EXPECT_OK(CheckRouting(c));
  c.route = "*norm*=muon";
  EXPECT_THAT(CheckRouting(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--route '*norm*=muon': param 'layers.0.attn_norm.weight': "
                                 "override '*norm*' routes it to muon, which needs a 2-D matrix, "
                                 "got shape [64]")));
  c.route = "*experts*=adamw";
  EXPECT_THAT(CheckRouting(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'*experts*' matches no param of model 'tiny'")));
  c.model = "moe-tiny";
  EXPECT_OK(CheckRouting(c));
  c.route = "*router*=muon, *norm*=adamw";
  EXPECT_OK(CheckRouting(c));
  c.model = "tiny";
  c.route = "*norm*=muon";
  c.optimizer = OptimizerChoice::kAdamW;  // every param to AdamW (ValidateTrainerConfig refuses
  EXPECT_OK(CheckRouting(c));             // a given --route there)
}

}  // namespace
}  // namespace orthoshard::integration
