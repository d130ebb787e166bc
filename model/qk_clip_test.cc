// QK-clip's model side: the per-head max logits a forward records and the fused QKV row factors,
// against testdata/qk_clip_reference.py (plain PyTorch in float64, run live through tools/python3)
// on the same weights and block inputs, within a bound derived from fp32 rounding; and the
// record's own contract (max over forwards, no effect on the forward, blocking).
#include "model/qk_clip.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/python.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace orthoshard::model {
namespace {

constexpr char kScript[] = "model/testdata/qk_clip_reference.py";
constexpr double kInf = std::numeric_limits<double>::infinity();

// 2 blocks, 4 query heads in 2 KV groups of head dim 8: the grouped layout is exercised.
GptConfig TestConfig() {
  GptConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.num_layers = 2;
  c.hidden = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden = 48;
  return c;
}

// The OSREF1 records of optimizers/testdata/torch_oracle.py: f32, f64, i64 tensors and text.
class Records {
 public:
  void Add(const std::string& name, const at::Tensor& t) { tensors_[name] = t.contiguous(); }
  void AddText(const std::string& name, const std::string& text) { texts_[name] = text; }
  const at::Tensor& Get(const std::string& name) const { return tensors_.at(name); }

  bool Write(const std::string& path) const {
    std::ofstream out(path, std::ios::binary);
    out.write("OSREF1\0\0", 8);
    Put<uint32_t>(out, static_cast<uint32_t>(tensors_.size() + texts_.size()));
    for (const auto& [name, text] : texts_) {
      Header(out, name, 2, {static_cast<int64_t>(text.size())});
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
    }
    for (const auto& [name, t] : tensors_) {
      const uint8_t code = t.scalar_type() == at::kFloat ? 0 : t.scalar_type() == at::kDouble ? 1 : 3;
      Header(out, name, code, t.sizes().vec());
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    }
    return static_cast<bool>(out);
  }

  bool Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char magic[8];
    in.read(magic, 8);
    if (!in || std::string(magic, 8) != std::string("OSREF1\0\0", 8)) return false;
    const uint32_t count = Take<uint32_t>(in);
    for (uint32_t i = 0; i < count && in; ++i) {
      std::string name(Take<uint32_t>(in), '\0');
      in.read(name.data(), static_cast<std::streamsize>(name.size()));
      const uint8_t code = Take<uint8_t>(in);
      std::vector<int64_t> dims(Take<uint32_t>(in));
      for (int64_t& d : dims) d = Take<int64_t>(in);
      at::Tensor t = at::empty(dims, code == 0 ? at::kFloat : code == 1 ? at::kDouble : at::kLong);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
      tensors_[name] = t;
    }
    return static_cast<bool>(in);
  }

 private:
  template <typename T>
  static void Put(std::ofstream& out, T value) {
    out.write(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  template <typename T>
  static T Take(std::ifstream& in) {
    T value{};
    in.read(reinterpret_cast<char*>(&value), sizeof(T));
    return value;
  }
  static void Header(std::ofstream& out, const std::string& name, uint8_t code,
                     const std::vector<int64_t>& dims) {
    Put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out.write(name.data(), static_cast<std::streamsize>(name.size()));
    Put<uint8_t>(out, code);
    Put<uint32_t>(out, static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) Put<int64_t>(out, d);
  }

  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, std::string> texts_;
};

// A model whose attention logits reach tens (the qkv weights scaled up from init), so that a
// threshold between its heads' maxima clips some groups and not others.
Gpt LargeLogitModel() {
  absl::StatusOr<Gpt> model = Gpt::Create(TestConfig(), /*seed=*/5);
  EXPECT_OK(model.status());
  at::NoGradGuard no_grad;
  for (const ModelParam& p : model->params()) {
    if (p.name.find("qkv") != std::string::npos) p.tensor.mul_(12.0);
  }
  return *std::move(model);
}

at::Tensor Tokens(int64_t rows, int64_t cols, int64_t vocab) {
  return at::arange(rows * cols, at::kLong).mul(37).add(11).remainder(vocab).view({rows, cols});
}

at::Tensor NegInfRecord(const GptConfig& c) {
  return at::full({c.num_layers, c.num_heads}, -kInf, at::kFloat);
}

// The max-logit record of one forward, and each block's input (the hooks' outputs of forward
// layers 0 .. L-1: the embedding, then every block but the last).
at::Tensor RecordForward(Gpt& model, const at::Tensor& tokens, const Documents* documents,
                         std::vector<at::Tensor>* block_inputs) {
  const int64_t L = model.config().num_layers;
  at::Tensor record = NegInfRecord(model.config());
  model.set_max_logit_record(record);
  block_inputs->assign(static_cast<size_t>(L), at::Tensor());
  LayerHooks hooks;
  hooks.post_forward = [&](int layer, const at::Tensor& output) {
    if (layer < L) (*block_inputs)[static_cast<size_t>(layer)] = output.detach().clone();
  };
  model.set_layer_hooks(hooks);
  at::NoGradGuard no_grad;
  EXPECT_OK(model.Forward(tokens, documents).status());
  model.set_layer_hooks({});
  model.set_max_logit_record(at::Tensor());
  return record;
}

const at::Tensor& Param(const Gpt& model, const std::string& name) {
  for (const ModelParam& p : model.params()) {
    if (p.name == name) return p.tensor;
  }
  ADD_FAILURE() << "no param " << name;
  static const at::Tensor none;
  return none;
}

// The per-head maxima and the clipped qkv of every block against the float64 reference.
//
// Tolerance. u = 2^-24 (fp32's unit roundoff). From the same fp32 block input x (bitwise: the
// hooks hand it over), the C++ logit of a pair (i, j) is computed in fp32 as
//   h = x rsqrt(mean(x^2) + eps) w    mean of C squares (gamma_C relative to a sum of non-negative
//                                     terms, halved by the square root), rsqrt, two products:
//                                     |dh| <= (C/2 + 5) u |h|
//   q_d = sum_c W_dc h_c              a C-term dot product: gamma_C of sum |W h|, plus dh:
//                                     |dq_d| <= (3C/2 + 5) u sum_c |W_dc h_c| = (3C/2 + 5) u |q|_d
//   q~ = (q1 c - q2 s, q1 s + q2 c)   cos/sin rounded to fp32 (1 each), two products, one sum:
//                                     |dq~| <= (3C/2 + 8) u |q~|, |q~| the same with |.| on every term
//   S = (sum_d q~_d k~_d) / sqrt(D)   a D-term dot product (gamma_D), the scale and its product (2),
//                                     the fp32 result (1): with q~ and k~ each off by the above,
//   |S_cpp - S| <= (2 (3C/2 + 8) + D + 3) u A = (3C + D + 19) u A, A = sum_d |q~|_d |k~|_d / sqrt(D),
// to first order (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1:
// |fl(x.y) - x.y| <= gamma_n |x|.|y|, gamma_n = n u / (1 - n u); second-order terms are below
// (n u)^2 ~ 5e-11 relative). The maximum over pairs moves by at most the largest pair's bound, so
// with A the reference's maximum of A over attended pairs (abs_logit), kLogitRoundings u A bounds
// each head's |S_cpp - S_ref|. The clip factor f = sqrt(tau / S) moves by f (|dS| / (2 S) + u)
// (the square root halves a relative error; rounding it to fp32 adds u), and the product W f one
// more u: |W_cpp - W_ref| <= |W| f (|dS| / (2 S) + 2u), with S and dS the group's maximum and its
// bound. A group that is not clipped keeps its rows bitwise (factor 1.0f), as value rows always do.
constexpr double kU = 0x1p-24;
double LogitRoundings(const GptConfig& c) {
  return 3.0 * c.hidden + c.hidden / c.num_heads + 19.0;
}

void CompareWithReference(const GptConfig& config, const std::string& name, const Records& mine,
                          const Records& ref, const at::Tensor& record, double tau) {
  const int64_t H = config.num_heads, KV = config.num_kv_heads, R = H / KV;
  const int64_t D = config.hidden / H;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const std::string at_l = absl::StrCat("/", l);
    const at::Tensor s_ref = ref.Get(name + "/max_logit" + at_l);
    const at::Tensor a_ref = ref.Get(name + "/abs_logit" + at_l);
    std::vector<double> bound(static_cast<size_t>(H));
    double worst = 0;  // the largest error as a fraction of its bound
    for (int64_t h = 0; h < H; ++h) {
      bound[h] = LogitRoundings(config) * kU * a_ref[h].item<double>();
      const double error = std::abs(record[l][h].item<double>() - s_ref[h].item<double>());
      EXPECT_LE(error, bound[h]) << name << " block " << l << " head " << h;
      worst = std::max(worst, error / bound[h]);
    }
    std::printf("%s block %lld: max logits %s, tau %.4g; largest error %.2g of its bound\n",
                name.c_str(), static_cast<long long>(l),
                absl::StrJoin(std::vector<float>(record[l].data_ptr<float>(),
                                                 record[l].data_ptr<float>() + H),
                              ", ")
                    .c_str(),
                tau, worst);
    const at::Tensor w = mine.Get(name + "/qkv" + at_l).view({KV, R + 2, D, -1});
    const at::Tensor w_cpp = mine.Get(name + "/new_qkv" + at_l).view({KV, R + 2, D, -1});
    const at::Tensor w_ref = ref.Get(name + "/new_qkv" + at_l).view({KV, R + 2, D, -1});
    for (int64_t g = 0; g < KV; ++g) {
      double s = -kInf, ds = 0;
      for (int64_t r = 0; r < R; ++r) {
        if (s_ref[g * R + r].item<double>() > s) s = s_ref[g * R + r].item<double>();
        ds = std::max(ds, bound[g * R + r]);
      }
      const double f = s > tau ? std::sqrt(tau / s) : 1.0;
      const double tolerance = f * (ds / (2 * s) + 2 * kU);
      const at::Tensor diff = w_cpp[g].to(at::kDouble).sub(w_ref[g]).abs();
      const at::Tensor allowed = w[g].to(at::kDouble).abs().mul(tolerance);
      EXPECT_TRUE(diff.le(allowed).all().item<bool>())
          << name << " block " << l << " group " << g << ": |dW| up to "
          << diff.max().item<double>() << " for S = " << s << ", tau = " << tau;
      EXPECT_TRUE(at::equal(w_cpp[g][R + 1], w[g][R + 1])) << "value rows of group " << g;
      if (s + ds < tau) EXPECT_TRUE(at::equal(w_cpp[g], w[g])) << "unclipped group " << g;
    }
  }
}

// One case: a forward with the record on, tau halfway between the smallest and largest maximum of
// block 0 (some groups clip, some do not), the factors applied to every block's qkv; the inputs and
// results written for the reference.
at::Tensor RunCase(Gpt& model, const std::string& name, const at::Tensor& tokens,
                   const Documents* documents, Records& mine, double* tau) {
  const GptConfig& c = model.config();
  std::vector<at::Tensor> inputs;
  const at::Tensor record = RecordForward(model, tokens, documents, &inputs);
  *tau = 0.5 * (record[0].min().item<double>() + record[0].max().item<double>());
  mine.Add(name + "/config",
           at::tensor(std::vector<int64_t>{c.num_layers, c.hidden, c.num_heads, c.num_kv_heads}));
  mine.Add(name + "/theta", at::tensor(c.rope_theta, at::kDouble).reshape({}));
  mine.Add(name + "/eps", at::tensor(c.norm_eps, at::kDouble).reshape({}));
  mine.Add(name + "/tau", at::tensor(*tau, at::kDouble).reshape({}));
  const at::Tensor positions =
      documents ? documents->positions : at::arange(tokens.size(1), at::kLong).expand_as(tokens);
  mine.Add(name + "/positions", positions);
  mine.Add(name + "/segments", documents ? documents->segments : at::zeros_like(tokens));
  int64_t clipped_total = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    const at::Tensor qkv = Param(model, p + "attn.qkv.weight");
    int64_t clipped = 0;
    const at::Tensor scales = QkClipRowScales(c, record[l], *tau, &clipped);
    clipped_total += clipped;
    mine.Add(absl::StrCat(name, "/x/", l), inputs[l]);
    mine.Add(absl::StrCat(name, "/attn_norm/", l), Param(model, p + "attn_norm.weight"));
    mine.Add(absl::StrCat(name, "/qkv/", l), qkv.detach());
    mine.Add(absl::StrCat(name, "/new_qkv/", l), qkv.detach().mul(scales.view({-1, 1})));
  }
  EXPECT_GE(clipped_total, 1) << name;  // tau splits block 0's heads: at least its top group clips
  return record;
}

class QkClipTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(QkClipTest, MatchesThePyTorchReference) {
  Gpt model = LargeLogitModel();
  const at::Tensor tokens = Tokens(3, 16, 64);
  // Row 0 one document, row 1 two (positions restart at 6), row 2 three.
  const at::Tensor segments = at::tensor(std::vector<int64_t>{
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
      0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,  //
      0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}).view({3, 16});
  const at::Tensor positions = at::tensor(std::vector<int64_t>{
      0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,  //
      0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4,  5,  6,  7,  8,  9,   //
      0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0,  1,  2,  3,  4,  5}).view({3, 16});
  const Documents documents{segments, positions};
  Records mine;
  double causal_tau = 0, documents_tau = 0;
  const at::Tensor causal = RunCase(model, "causal", tokens, nullptr, mine, &causal_tau);
  const at::Tensor docs = RunCase(model, "documents", tokens, &documents, mine, &documents_tau);
  mine.AddText("cases", "causal\ndocuments");
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string in = dir + "/qk_clip_in.osref", out = dir + "/qk_clip_out.osref";
  ASSERT_TRUE(mine.Write(in));
  ASSERT_OK_AND_ASSIGN(const std::string python, orthoshard::testing::ProjectPython(kScript));
  const orthoshard::testing::CommandResult run =
      orthoshard::testing::RunPython(python, kScript, {in, out});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::printf("%s", run.output.c_str());
  Records ref;
  ASSERT_TRUE(ref.Read(out));
  CompareWithReference(model.config(), "causal", mine, ref, causal, causal_tau);
  CompareWithReference(model.config(), "documents", mine, ref, docs, documents_tau);
}

// The record is the max over the forwards since it was reset, and recording changes nothing the
// forward computes.
TEST_F(QkClipTest, RecordFoldsForwardsAndLeavesTheForwardAlone) {
  Gpt model = LargeLogitModel();
  const at::Tensor a = Tokens(2, 16, 64), b = Tokens(2, 16, 64).flip({1});
  std::vector<at::Tensor> ignored;
  const at::Tensor ra = RecordForward(model, a, nullptr, &ignored);
  const at::Tensor rb = RecordForward(model, b, nullptr, &ignored);
  at::Tensor both = NegInfRecord(model.config());
  model.set_max_logit_record(both);
  at::NoGradGuard no_grad;
  ASSERT_OK_AND_ASSIGN(const at::Tensor with_a, model.Forward(a));
  ASSERT_OK(model.Forward(b).status());
  model.set_max_logit_record(at::Tensor());
  EXPECT_TRUE(at::equal(both, at::maximum(ra, rb)));
  ASSERT_OK_AND_ASSIGN(const at::Tensor without_a, model.Forward(a));
  EXPECT_TRUE(at::equal(with_a, without_a));
}

// Blocks of a few query positions (and of whole rows) give the maxima of one block for all.
TEST_F(QkClipTest, BlockingGivesTheSameMaxima) {
  const at::Tensor q = at::randn({3, 4, 16, 8}), k = at::randn({3, 2, 16, 8});
  const at::Tensor whole = MaxAttentionLogits(q, k, at::Tensor());
  for (const int64_t block : {int64_t{1}, int64_t{200}, int64_t{64 * 16 * 2}}) {
    EXPECT_TRUE(at::allclose(MaxAttentionLogits(q, k, at::Tensor(), block), whole, 1e-6, 1e-6))
        << block;
  }
}

// Factors: exactly 1 at or below tau, sqrt(tau / S_g) on the group's query and key rows above.
TEST_F(QkClipTest, RowScalesPerGroup) {
  const GptConfig c = TestConfig();  // 4 heads, 2 groups of 2, head dim 8
  int64_t clipped = -1;
  const at::Tensor none = QkClipRowScales(c, at::tensor({1.0f, 2.0f, 3.0f, 4.0f}), 4.0, &clipped);
  EXPECT_EQ(clipped, 0);
  EXPECT_TRUE(at::equal(none, at::ones({64})));
  const at::Tensor some = QkClipRowScales(c, at::tensor({1.0f, 16.0f, 3.0f, 4.0f}), 4.0, &clipped);
  EXPECT_EQ(clipped, 1);
  const at::Tensor g0 = some.narrow(0, 0, 32), g1 = some.narrow(0, 32, 32);
  EXPECT_TRUE(at::equal(g0.narrow(0, 0, 24), at::full({24}, 0.5f)));  // sqrt(4 / 16)
  EXPECT_TRUE(at::equal(g0.narrow(0, 24, 8), at::ones({8})));         // value rows
  EXPECT_TRUE(at::equal(g1, at::ones({32})));
}

}  // namespace
}  // namespace orthoshard::model
