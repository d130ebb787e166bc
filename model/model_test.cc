#include "model/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/zeros.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/param_shapes.h"
#include "optimizers/routing.h"

namespace orthoshard::model {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

GptConfig Small(bool tied) {
  GptConfig c;
  c.vocab_size = 11;
  c.max_seq_len = 8;
  c.num_layers = 2;
  c.hidden = 8;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden = 12;
  c.tie_embeddings = tied;
  c.init_std = 0.3;  // large enough that every path matters in the gradient check
  return c;
}

at::Tensor Tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, t}, gen, at::TensorOptions().dtype(at::kLong));
}

TEST(GptConfig, PresetsAndValidation) {
  ASSERT_OK_AND_ASSIGN(GptConfig tiny, GptPreset("tiny"));
  EXPECT_OK(ValidateConfig(tiny));
  ASSERT_OK_AND_ASSIGN(GptConfig small, GptPreset("small"));
  EXPECT_OK(ValidateConfig(small));
  ASSERT_OK_AND_ASSIGN(GptConfig gpt2, GptPreset("gpt2-124m"));
  EXPECT_OK(ValidateConfig(gpt2));
  EXPECT_EQ(gpt2.num_layers, 12);
  EXPECT_EQ(gpt2.hidden, 768);
  EXPECT_EQ(gpt2.num_heads, 12);
  EXPECT_EQ(gpt2.vocab_size, 50304);
  EXPECT_EQ(gpt2.max_seq_len, 1024);
  // TinyLlama-1.1B's shape, with its published parameter count.
  ASSERT_OK_AND_ASSIGN(GptConfig llama, GptPreset("tinyllama-1.1b"));
  EXPECT_OK(ValidateConfig(llama));
  EXPECT_EQ(GptParamCount(llama), 1'100'048'384);
  EXPECT_EQ(GptHiddenMatrixCount(llama), 22 * (5'242'880 + 4'194'304 + 23'068'672 + 11'534'336));
  EXPECT_THAT(GptPreset("huge"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown model preset 'huge'; expected one of tiny, small, "
                                 "gpt2-124m, tinyllama-1.1b")));
  GptConfig bad = Small(true);
  bad.num_kv_heads = 3;
  EXPECT_THAT(ValidateConfig(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("num_heads 4 is not divisible by "
                                                      "num_kv_heads 3")));
  bad = Small(true);
  bad.hidden = 12;
  bad.num_heads = 4;
  bad.num_kv_heads = 4;
  EXPECT_THAT(ValidateConfig(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("head_dim 3 must be even")));
  bad = Small(true);
  bad.num_layers = 0;
  EXPECT_THAT(Gpt::Create(bad, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("GptConfig: num_layers must be > 0, got 0")));
  EXPECT_THAT(Gpt::Create(Small(true), 1, at::kHalf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param dtype must be float, bfloat16 or double, got Half")));
}

// Resident memory of this process (/proc/self/statm), in bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Create draws the values ForEachInitialValue hands out, in order, one param at a time; a model
// built without them takes (on the CPU) no memory for its params until they are written: the
// 1.1B-param preset's 4.4 GB of params stay virtual, so a ZeRO-3 rank that writes only its shards
// never holds the whole initialised model.
TEST(Gpt, InitialValuesStreamOneParamAtATime) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(false), 21));
  ASSERT_OK_AND_ASSIGN(Gpt bare, Gpt::CreateUninitialized(Small(false)));
  int calls = 0;
  ASSERT_OK(bare.ForEachInitialValue(21, [&](int i, const at::Tensor& value) {
    EXPECT_EQ(i, calls++);
    EXPECT_EQ(value.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(value, model.params()[i].tensor)) << model.params()[i].name;
    return absl::OkStatus();
  }));
  EXPECT_EQ(calls, static_cast<int>(model.params().size()));
  EXPECT_THAT(bare.ForEachInitialValue(21,
                                       [](int i, const at::Tensor&) {
                                         return i == 3 ? absl::DataLossError("sink full")
                                                       : absl::OkStatus();
                                       }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sink full")));

  const int64_t before = ResidentBytes();
  ASSERT_OK_AND_ASSIGN(GptConfig llama, GptPreset("tinyllama-1.1b"));
  ASSERT_OK_AND_ASSIGN(Gpt big, Gpt::CreateUninitialized(llama));
  EXPECT_EQ(big.num_params(), GptParamCount(llama));
  // 4.4 GB of params; what grows is the rotary tables and allocator bookkeeping.
  EXPECT_LT(ResidentBytes() - before, int64_t{256} << 20);
}

TEST(Gpt, ParamsNamesShapesRolesAndSplits) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(/*tied=*/false), 1));
  std::vector<std::string> names;
  for (const ModelParam& p : model.params()) names.push_back(p.name);
  EXPECT_THAT(names, ElementsAre("embedding.weight", "layers.0.attn_norm.weight",
                                 "layers.0.attn.qkv.weight", "layers.0.attn.proj.weight",
                                 "layers.0.mlp_norm.weight", "layers.0.mlp.fc1.weight",
                                 "layers.0.mlp.fc2.weight", "layers.1.attn_norm.weight",
                                 "layers.1.attn.qkv.weight", "layers.1.attn.proj.weight",
                                 "layers.1.mlp_norm.weight", "layers.1.mlp.fc1.weight",
                                 "layers.1.mlp.fc2.weight", "final_norm.weight",
                                 "output_layer.weight"));
  const auto& p = model.params();
  EXPECT_EQ(p[0].kind, ParamKind::kEmbedding);
  EXPECT_EQ(p[0].tensor.sizes(), (std::vector<int64_t>{11, 8}));
  // H = 4, KV = 2, D = 2: (4 + 2 * 2) * 2 = 16 rows in 2 groups of {2 queries * 2, 2, 2}.
  EXPECT_EQ(p[2].tensor.sizes(), (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(p[2].kind, ParamKind::kHidden);
  EXPECT_EQ(p[2].split.num_groups, 2);
  EXPECT_THAT(p[2].split.block_rows, ElementsAre(4, 2, 2));
  EXPECT_EQ(p[5].tensor.sizes(), (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(p[5].split.num_groups, 1);
  EXPECT_THAT(p[5].split.block_rows, ElementsAre(12, 12));
  EXPECT_EQ(p[6].tensor.sizes(), (std::vector<int64_t>{8, 12}));
  EXPECT_TRUE(p[6].split.block_rows.empty());
  EXPECT_EQ(p[1].kind, ParamKind::kNorm);
  EXPECT_EQ(p[14].kind, ParamKind::kOutput);
  std::vector<int> layers;
  for (const ModelParam& q : p) layers.push_back(q.layer);
  EXPECT_THAT(layers, ElementsAre(0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3));
  for (const ModelParam& q : p) EXPECT_TRUE(q.tensor.requires_grad()) << q.name;
  EXPECT_EQ(model.num_forward_layers(), 4);
  for (const ModelParam& q : p) {
    EXPECT_TRUE(q.tensor.is_leaf()) << q.name;
    EXPECT_EQ(q.tensor.device(), at::Device(at::kCPU));
    EXPECT_EQ(q.tensor.scalar_type(), at::kFloat);
  }

  ASSERT_OK_AND_ASSIGN(Gpt tied, Gpt::Create(Small(/*tied=*/true), 1));
  EXPECT_EQ(tied.params().size(), 14u);
  EXPECT_EQ(tied.params().back().name, "final_norm.weight");
  EXPECT_EQ(tied.num_params(), model.num_params() - 11 * 8);
}

// The optimizers' default name-based routing sends exactly the kHidden params to Muon.
// GptParamShapes (what a checkpoint's config is checked against, with nothing allocated) lists
// exactly the params Gpt builds, in order, with their shapes.
TEST(Gpt, ParamShapesTableListsTheModelsParams) {
  std::vector<GptConfig> configs;
  for (const char* preset : {"tiny", "small", "gpt2-124m", "moe-tiny", "moe-tiny-shared"}) {
    configs.push_back(*GptPreset(preset));
  }
  configs.push_back(configs.front());
  configs.back().tie_embeddings = false;
  for (const GptConfig& config : configs) {
    ASSERT_OK_AND_ASSIGN(const Gpt model, Gpt::CreateUninitialized(config));
    const std::vector<ParamShape> table = GptParamShapes(config);
    ASSERT_EQ(table.size(), model.params().size());
    for (size_t i = 0; i < table.size(); ++i) {
      const ModelParam& p = model.params()[i];
      EXPECT_EQ(table[i].name, p.name);
      EXPECT_EQ(table[i].shape, std::vector<int64_t>(p.tensor.sizes().begin(),
                                                     p.tensor.sizes().end()))
          << p.name;
    }
  }
}

TEST(Gpt, NamesRouteLikeKinds) {
  for (bool tied : {false, true}) {
    ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(tied), 1));
    std::vector<optimizers::ParamDescriptor> descriptors;
    for (const ModelParam& p : model.params()) {
      descriptors.push_back({p.name, std::vector<int64_t>(p.tensor.sizes().begin(),
                                                          p.tensor.sizes().end())});
    }
    ASSERT_OK_AND_ASSIGN(optimizers::RoutingReport report,
                         optimizers::PlanRouting(optimizers::RoutingConfig{}, descriptors));
    for (size_t i = 0; i < descriptors.size(); ++i) {
      EXPECT_EQ(report.entries[i].route == optimizers::Route::kMuon,
                model.params()[i].kind == ParamKind::kHidden)
          << model.params()[i].name;
    }
  }
}

TEST(Gpt, ForwardShapeAndErrors) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(true), 1));
  ASSERT_OK_AND_ASSIGN(at::Tensor logits, model.Forward(Tokens(3, 5, 11, 1)));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 5, 11}));
  EXPECT_THAT(model.Forward(Tokens(3, 9, 11, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Gpt: tokens shape [3, 9] needs batch >= 1 and 1 <= seq <= 8")));
  EXPECT_THAT(model.Forward(Tokens(3, 5, 11, 1).to(at::kInt)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Gpt: tokens must be an int64 tensor [batch, seq], got Int [3, 5]")));
  at::Tensor bad = Tokens(2, 4, 11, 1);
  bad.index_put_({1, 2}, 11);
  EXPECT_THAT(model.Forward(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("tokens ids must be in [0, 11), got range")));
  EXPECT_THAT(model.Loss(Tokens(2, 4, 11, 1), Tokens(2, 3, 11, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("targets shape [2, 3] differs from tokens shape [2, 4]")));
}

// Mixed precision: bf16 params give bf16 logits and an fp32 loss, with gradients for every param.
// The model's claim that ATen's bf16 RMSNorm computes in fp32 and rounds once is checked here, on
// this machine's kernels: against the fp32 norm rounded to bf16, within one bf16 ulp (2^-7 of the
// value, at most), since the two kernels' fp32 sums may differ in their last bits and flip a
// rounding (bitwise on this AVX2 machine). The bf16 model's loss
// against the fp32 model's of the same seed: params rounded to bf16 (relative 2^-9) and bf16
// activations (each rounded to 2^-9 relative, GEMMs accumulating in fp32) move a loss near log(11)
// by a few times 2^-8 of the logits' size (~1 here): 0.05 is a 5x margin on 4 x 2^-8 = 0.016.
TEST(Gpt, Bf16MixedPrecision) {
  const at::Tensor x = at::randn({16, 64}, at::kFloat).mul(3).to(at::kBFloat16);
  const at::Tensor w = at::randn({64}, at::kFloat).to(at::kBFloat16);
  const at::Tensor got = at::rms_norm(x, {64}, w, 1e-5).to(at::kFloat);
  const at::Tensor fp32_rounded =
      at::rms_norm(x.to(at::kFloat), {64}, w.to(at::kFloat), 1e-5).to(at::kBFloat16).to(at::kFloat);
  EXPECT_TRUE((got - fp32_rounded).abs().le(fp32_rounded.abs().mul(1.0 / 128)).all().item<bool>());

  ASSERT_OK_AND_ASSIGN(Gpt bf16, Gpt::Create(Small(true), 5, at::kBFloat16));
  ASSERT_OK_AND_ASSIGN(Gpt fp32, Gpt::Create(Small(true), 5));
  const at::Tensor tokens = Tokens(3, 8, 11, 4), targets = Tokens(3, 8, 11, 5);
  ASSERT_OK_AND_ASSIGN(at::Tensor logits, bf16.Forward(tokens));
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  ASSERT_OK_AND_ASSIGN(at::Tensor loss, bf16.Loss(tokens, targets));
  ASSERT_OK_AND_ASSIGN(at::Tensor want, fp32.Loss(tokens, targets));
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_NEAR(loss.item<double>(), want.item<double>(), 0.05);
  loss.backward();
  for (const ModelParam& p : bf16.params()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_EQ(p.tensor.grad().scalar_type(), at::kBFloat16) << p.name;
  }
}

TEST(Gpt, SameSeedSameParams) {
  ASSERT_OK_AND_ASSIGN(Gpt a, Gpt::Create(Small(false), 42));
  ASSERT_OK_AND_ASSIGN(Gpt b, Gpt::Create(Small(false), 42));
  ASSERT_OK_AND_ASSIGN(Gpt c, Gpt::Create(Small(false), 43));
  for (size_t i = 0; i < a.params().size(); ++i) {
    EXPECT_TRUE(at::equal(a.params()[i].tensor, b.params()[i].tensor)) << a.params()[i].name;
    if (a.params()[i].kind != ParamKind::kNorm) {
      EXPECT_FALSE(at::equal(a.params()[i].tensor, c.params()[i].tensor)) << a.params()[i].name;
    }
  }
  const at::Tensor tokens = Tokens(2, 8, 11, 3);
  ASSERT_OK_AND_ASSIGN(at::Tensor la, a.Forward(tokens));
  ASSERT_OK_AND_ASSIGN(at::Tensor lb, b.Forward(tokens));
  EXPECT_TRUE(at::equal(la, lb));
}

TEST(Gpt, Causal) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(false), 7));
  const at::Tensor a = Tokens(2, 8, 11, 4);
  at::Tensor b = a.clone();
  b.narrow(1, 5, 3).copy_(Tokens(2, 3, 11, 5));
  ASSERT_OK_AND_ASSIGN(at::Tensor la, model.Forward(a));
  ASSERT_OK_AND_ASSIGN(at::Tensor lb, model.Forward(b));
  // Bitwise: the prefix rows go through the same kernels in both forwards (same shapes, same
  // machine), and SDPA's causal mask drops the changed keys before they reach a prefix row.
  EXPECT_TRUE(at::equal(la.narrow(1, 0, 5), lb.narrow(1, 0, 5)));
  EXPECT_FALSE(at::allclose(la.narrow(1, 5, 3), lb.narrow(1, 5, 3), 1e-5, 1e-6));
}

// Documents: with the loader's segments and positions, a document's logits do not depend on the
// document before it in the row (bitwise: same shapes, and the mask drops the other document's
// keys before the softmax), and they are the logits of that document alone at the row's start.
TEST(Gpt, DocumentsDoNotSeeEachOther) {
  const GptConfig config = Small(true);
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(config, 7, at::kDouble));
  // Row: document A (3 tokens, the last its EOD) then document B (5 tokens).
  const at::Tensor a = Tokens(1, 8, 11, 4);
  at::Tensor b = a.clone();
  b.narrow(1, 0, 2).copy_(Tokens(1, 2, 11, 9));  // another document A, same length
  const auto ids = [](std::vector<int64_t> v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).view({1, 8});
  };
  const Documents documents{ids({0, 0, 0, 1, 1, 1, 1, 1}), ids({0, 1, 2, 0, 1, 2, 3, 4})};
  ASSERT_OK_AND_ASSIGN(at::Tensor la, model.Forward(a, &documents));
  ASSERT_OK_AND_ASSIGN(at::Tensor lb, model.Forward(b, &documents));
  EXPECT_TRUE(at::equal(la.narrow(1, 3, 5), lb.narrow(1, 3, 5)));
  EXPECT_FALSE(at::allclose(la.narrow(1, 0, 3), lb.narrow(1, 0, 3), 1e-5, 1e-6));
  // Without documents the same change reaches B (the test above is not vacuous).
  ASSERT_OK_AND_ASSIGN(at::Tensor ca, model.Forward(a));
  ASSERT_OK_AND_ASSIGN(at::Tensor cb, model.Forward(b));
  EXPECT_FALSE(at::allclose(ca.narrow(1, 3, 5), cb.narrow(1, 3, 5), 1e-5, 1e-6));
  // B alone: other shapes, so not bitwise. fp64 throughout: each logit is a few hundred
  // operations deep with |values| < 10, so rounding differences stay below 1e3 * 2^-52 * 10 ~
  // 2e-12; 1e-10 leaves room and is still 10^7 times below the change above.
  ASSERT_OK_AND_ASSIGN(at::Tensor alone, model.Forward(a.narrow(1, 3, 5).contiguous()));
  EXPECT_TRUE(at::allclose(la.narrow(1, 3, 5), alone, 0, 1e-10));
  // Document A's logits are those of A alone too (the causal prefix).
  ASSERT_OK_AND_ASSIGN(at::Tensor a_alone, model.Forward(a.narrow(1, 0, 3).contiguous()));
  EXPECT_TRUE(at::allclose(la.narrow(1, 0, 3), a_alone, 0, 1e-10));

  // Loss over ignored targets: the mean over the counted ones, the sum of them.
  at::Tensor targets = Tokens(1, 8, 11, 5);
  ASSERT_OK_AND_ASSIGN(at::Tensor all, model.Loss(a, targets, &documents, LossReduction::kSum));
  targets[0][2] = -100;
  ASSERT_OK_AND_ASSIGN(at::Tensor sum, model.Loss(a, targets, &documents, LossReduction::kSum));
  ASSERT_OK_AND_ASSIGN(at::Tensor mean, model.Loss(a, targets, &documents));
  EXPECT_LT(sum.item<double>(), all.item<double>());
  EXPECT_NEAR(mean.item<double>(), sum.item<double>() / 7, 1e-12);

  // Malformed documents are refused, naming the field.
  const Documents short_positions{ids({0, 0, 0, 1, 1, 1, 1, 1}), ids({0, 1, 2, 0, 1, 2, 3, 4})
                                                                     .narrow(1, 0, 4)};
  EXPECT_THAT(model.Forward(a, &short_positions),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("documents' positions must be an int64 tensor of the tokens' "
                                 "shape [1, 8]")));
  const Documents far{ids({0, 0, 0, 1, 1, 1, 1, 1}), ids({0, 1, 2, 0, 1, 2, 3, 8})};
  EXPECT_THAT(model.Forward(a, &far),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("documents' positions must be in [0, 8), got range [0, 8]")));
}

TEST(Rotary, MatchesDirectFormula) {
  const int64_t B = 2, N = 3, T = 7, D = 6;
  const double theta = 100.0;
  at::Tensor cos, sin;
  RotaryTables(/*max_seq_len=*/10, D, theta, at::kDouble, &cos, &sin);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x = at::randn({B, N, T, D}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor y = ApplyRotary(x, cos, sin);
  ASSERT_EQ(y.sizes(), x.sizes());
  const auto xa = x.accessor<double, 4>();
  const auto ya = y.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < D / 2; ++j) {
          // The tables compute the angle as t * theta^(-2j/D), this as t / theta^(2j/D): with
          // pow within 1 ulp the angles (<= 6) differ by <= 4 * 2^-53 * 6, cos and sin add 1 ulp
          // each, and the output 3 roundings; times |x1| + |x2| <= ~6 (randn, 5.2 measured) that
          // is below 2e-14, so 1e-12 leaves 50x (2.2e-16 measured).
          const double angle = t / std::pow(theta, 2.0 * j / D);
          const double x1 = xa[b][n][t][j], x2 = xa[b][n][t][j + D / 2];
          EXPECT_NEAR(ya[b][n][t][j], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-12);
          EXPECT_NEAR(ya[b][n][t][j + D / 2], x1 * std::sin(angle) + x2 * std::cos(angle), 1e-12);
        }
      }
    }
  }
  // Rotations preserve the dot product's dependence on relative position only:
  // <R_s q, R_t k> == <R_{s+1} q, R_{t+1} k>.
  const at::Tensor q = at::randn({1, 1, 1, D}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor qs = ApplyRotary(q.expand({1, 1, 10, D}).contiguous(), cos, sin);
  const at::Tensor ks = ApplyRotary(q.expand({1, 1, 10, D}).contiguous() * 0.5 + 1, cos, sin);
  const double d25 = (qs.select(2, 2) * ks.select(2, 5)).sum().item<double>();
  const double d36 = (qs.select(2, 3) * ks.select(2, 6)).sum().item<double>();
  // Equal in exact arithmetic; each side is a 6-term dot product of rotated vectors whose tables
  // are within ~4 * 2^-53 relative of exact (angles <= 9), plus 6 products and 5 additions: about
  // (6 * 4 + 11) * 2^-53 * sum |q_i k_i| <= 35 * 1.1e-16 * ~10 ~ 4e-14 per side, so 1e-12 leaves
  // more than 10x (2.2e-16 measured).
  EXPECT_NEAR(d25, d36, 1e-12);
}

// An independent forward from the documented layout, head by head with explicit formulas:
// RMSNorm x / sqrt(mean(x^2) + eps) * w; query head h of group g = h / R reads qkv rows
// [g*(R+2)*D + (h % R)*D, +D), its key rows [g*(R+2)*D + R*D, +D), value rows the D after;
// softmax(q k^T / sqrt(D) + causal mask) v; SwiGLU silu(gate) * up with gate = fc1 rows [0, F).
at::Tensor ReferenceLogits(const Gpt& model, const at::Tensor& tokens) {
  const GptConfig& c = model.config();
  const int64_t T = tokens.size(1), C = c.hidden, H = c.num_heads, KV = c.num_kv_heads;
  const int64_t D = C / H, R = H / KV, F = c.ffn_hidden;
  const auto& p = model.params();
  auto rms = [&](const at::Tensor& x, const at::Tensor& w) {
    return x / ((x * x).mean({-1}, true) + c.norm_eps).sqrt() * w;
  };
  at::Tensor cos, sin;
  RotaryTables(c.max_seq_len, D, c.rope_theta, at::kDouble, &cos, &sin);
  const at::Tensor mask = at::tril(at::ones({T, T}, at::TensorOptions().dtype(at::kBool)));
  at::Tensor x = p[0].tensor.index_select(0, tokens.reshape({-1})).view({tokens.size(0), T, C});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const at::Tensor* w[6];
    for (int k = 0; k < 6; ++k) w[k] = &p[1 + 6 * l + k].tensor;
    const at::Tensor h = rms(x, *w[0]);
    std::vector<at::Tensor> heads;
    for (int64_t head = 0; head < H; ++head) {
      const int64_t base = (head / R) * (R + 2) * D;
      const at::Tensor q = ApplyRotary(at::matmul(h, w[1]->narrow(0, base + (head % R) * D, D).t())
                                           .unsqueeze(1), cos, sin);
      const at::Tensor k = ApplyRotary(at::matmul(h, w[1]->narrow(0, base + R * D, D).t())
                                           .unsqueeze(1), cos, sin);
      const at::Tensor v = at::matmul(h, w[1]->narrow(0, base + (R + 1) * D, D).t());
      at::Tensor scores = at::matmul(q.squeeze(1), k.squeeze(1).transpose(1, 2)) / std::sqrt(D);
      scores = scores.masked_fill(mask.logical_not(), -INFINITY);
      heads.push_back(at::matmul(at::softmax(scores, -1), v));
    }
    x = x + at::matmul(at::cat(at::TensorList(heads), -1), w[2]->t());
    const at::Tensor m = rms(x, *w[3]);
    const at::Tensor gate = at::matmul(m, w[4]->narrow(0, 0, F).t());
    const at::Tensor up = at::matmul(m, w[4]->narrow(0, F, F).t());
    x = x + at::matmul(gate * at::sigmoid(gate) * up, w[5]->t());
  }
  x = rms(x, p[1 + 6 * c.num_layers].tensor);
  const at::Tensor& out = c.tie_embeddings ? p[0].tensor : p.back().tensor;
  return at::matmul(x, out.t());
}

TEST(Gpt, MatchesReferenceFormulas) {
  for (bool tied : {false, true}) {
    ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(tied), 21, at::kDouble));
    const at::Tensor tokens = Tokens(3, 7, 11, 12);
    ASSERT_OK_AND_ASSIGN(at::Tensor logits, model.Forward(tokens));
    at::NoGradGuard no_grad;
    const at::Tensor reference = ReferenceLogits(model, tokens);
    // Same maths in another order (SDPA vs explicit softmax, fused rms_norm vs the formula): in
    // fp64 each of the ~100 ops on a logit's path (2 layers of length-8/12 dot products,
    // softmax over <= 7 keys, norms) adds ~2^-53 relative, amplified by the small condition
    // numbers of this init (std 0.3, logits |z| <= ~3): ~100 * 10 * 2^-53 * 3 ~ 3e-13 per side.
    // 1e-10 (rtol and atol) leaves over 100x (1.3e-15 measured).
    EXPECT_TRUE(at::allclose(logits, reference, 1e-10, 1e-10))
        << "tied " << tied << " max diff " << (logits - reference).abs().max().item<double>();
  }
}

// The hooks run once per forward layer, in order, post_forward with the layer's output; a wrapper
// that fills a param only from pre_forward of its first reader to post_forward of its last (the
// embedding's last reader is the head when tied) gets the same logits as a model whose params were
// there all along, and the same gradients.
TEST(Gpt, LayerHooksRunAroundEachLayerAndItsReadsOfParams) {
  for (bool tied : {false, true}) {
    ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(tied), 11));
    const at::Tensor tokens = Tokens(2, 8, 11, 6);
    ASSERT_OK_AND_ASSIGN(at::Tensor reference, model.Forward(tokens));
    ASSERT_OK_AND_ASSIGN(at::Tensor reference_loss, model.Loss(tokens, tokens));
    reference_loss.backward();
    std::vector<at::Tensor> saved, reference_grads;
    {
      at::NoGradGuard no_grad;
      for (const ModelParam& p : model.params()) {
        saved.push_back(p.tensor.clone());
        reference_grads.push_back(p.tensor.grad().clone());
        p.tensor.mutable_grad() = at::Tensor();
        p.tensor.fill_(std::nan(""));
      }
    }
    const int head = model.num_forward_layers() - 1;
    auto readers = [&](const ModelParam& p) {
      std::vector<int> layers = {p.layer};
      layers.insert(layers.end(), p.also_read_by.begin(), p.also_read_by.end());
      return layers;
    };
    EXPECT_EQ(model.params().front().also_read_by,
              tied ? std::vector<int>{head} : std::vector<int>{});
    std::vector<int> entered, left;
    std::vector<std::vector<int64_t>> output_shapes;
    LayerHooks hooks;
    hooks.pre_forward = [&](int layer) {
      entered.push_back(layer);
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < model.params().size(); ++i) {
        const std::vector<int> r = readers(model.params()[i]);
        if (*std::min_element(r.begin(), r.end()) == layer)
          model.params()[i].tensor.copy_(saved[i]);
      }
    };
    // Gone after the last reader, as a ZeRO-3 wrapper would release it (forward only: the
    // backward below runs on a fresh forward without the release).
    bool release = true;
    hooks.post_forward = [&](int layer, const at::Tensor& output) {
      left.push_back(layer);
      output_shapes.push_back(output.sizes().vec());
      if (!release) return;
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < model.params().size(); ++i) {
        const std::vector<int> r = readers(model.params()[i]);
        if (*std::max_element(r.begin(), r.end()) == layer)
          model.params()[i].tensor.fill_(std::nan(""));
      }
    };
    model.set_layer_hooks(hooks);
    {
      at::NoGradGuard no_grad;
      ASSERT_OK_AND_ASSIGN(at::Tensor logits, model.Forward(tokens));
      EXPECT_TRUE(at::equal(logits, reference)) << "tied " << tied;
    }
    EXPECT_THAT(entered, ElementsAre(0, 1, 2, 3));
    EXPECT_THAT(left, ElementsAre(0, 1, 2, 3));
    const std::vector<int64_t> hidden = {2, 8, Small(tied).hidden};
    EXPECT_THAT(output_shapes, ElementsAre(hidden, hidden, hidden,
                                           std::vector<int64_t>{2, 8, Small(tied).vocab_size}));
    release = false;
    ASSERT_OK_AND_ASSIGN(at::Tensor loss, model.Loss(tokens, tokens));
    EXPECT_TRUE(at::equal(loss, reference_loss));
    loss.backward();
    for (size_t i = 0; i < model.params().size(); ++i) {
      EXPECT_TRUE(at::equal(model.params()[i].tensor.grad(), reference_grads[i]))
          << model.params()[i].name;
    }
    model.set_layer_hooks({});
    entered.clear();
    ASSERT_OK(model.Forward(tokens).status());
    EXPECT_TRUE(entered.empty());
  }
}

// A contiguous param buffer (as buffers/ builds) can take over the params' storage with set_data:
// the model then reads the buffer, and gradients still reach the same leaves.
TEST(Gpt, ParamsCanBecomeViewsOfOneBuffer) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(false), 13));
  const at::Tensor tokens = Tokens(2, 8, 11, 14);
  ASSERT_OK_AND_ASSIGN(at::Tensor reference, model.Forward(tokens));
  const at::Tensor buffer = at::zeros({model.num_params()});
  int64_t offset = 0;
  for (const ModelParam& p : model.params()) {
    at::Tensor view = buffer.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes());
    view.copy_(p.tensor.detach());
    p.tensor.set_data(view);
    offset += p.tensor.numel();
  }
  ASSERT_OK_AND_ASSIGN(at::Tensor logits, model.Forward(tokens));
  EXPECT_TRUE(at::equal(logits, reference));
  buffer.mul_(0.5);  // the model sees writes to the buffer
  ASSERT_OK_AND_ASSIGN(at::Tensor halved, model.Forward(tokens));
  EXPECT_FALSE(at::allclose(halved, reference));
  ASSERT_OK_AND_ASSIGN(at::Tensor loss, model.Loss(tokens, tokens));
  loss.backward();
  for (const ModelParam& p : model.params()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_EQ(p.tensor.grad().sizes(), p.tensor.sizes());
  }
  EXPECT_EQ(model.params()[3].tensor.data_ptr<float>(),
            buffer.data_ptr<float>() + model.params()[0].tensor.numel() +
                model.params()[1].tensor.numel() + model.params()[2].tensor.numel());
}

// Autograd gradients against central finite differences, in double.
TEST(Gpt, GradientMatchesFiniteDifferences) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(Small(false), 3, at::kDouble));
  const at::Tensor tokens = Tokens(2, 6, 11, 8);
  const at::Tensor targets = Tokens(2, 6, 11, 9);
  ASSERT_OK_AND_ASSIGN(at::Tensor loss, model.Loss(tokens, targets));
  loss.backward();
  at::NoGradGuard no_grad;
  auto loss_value = [&] { return model.Loss(tokens, targets).value().item<double>(); };
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(10);
  for (const ModelParam& p : model.params()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    const at::Tensor flat = p.tensor.view({-1});
    const at::Tensor grad = p.tensor.grad().reshape({-1});
    for (int k = 0; k < 3; ++k) {
      const int64_t i = at::randint(flat.numel(), {1}, gen, at::TensorOptions().dtype(at::kLong))
                            .item<int64_t>();
      const double h = 1e-6;
      const double original = flat[i].item<double>();
      flat[i].fill_(original + h);
      const double up = loss_value();
      flat[i].fill_(original - h);
      const double down = loss_value();
      flat[i].fill_(original);
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad[i].item<double>();
      // Central differences err by the truncation h^2 / 6 |L'''| (~2e-13 * |L'''|, below 1e-11
      // for |L'''| <= 100) plus the roundoff of the two loss evaluations over 2h: with
      // |L| ~ 2.5 and at most ~100 roundings of 2^-53 each, 100 * 1.1e-16 * 2.5 / 1e-6 ~ 3e-8.
      // The autograd side is exact to ~1e-14. So 1e-6 absolute is ~30x the worst case, and the
      // 1e-5 relative term keeps large gradients from failing on their own roundoff (largest
      // |analytic - numeric| measured: 4.7e-10).
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << p.name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace orthoshard::model
