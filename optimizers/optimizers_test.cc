// Unit tests for AdamW, Muon and the ChainedOptimizer beyond the PyTorch oracle: fused-weight block
// splitting, mixed precision, clipping modes, the non-finite step skip, state round trips and the
// exact error messages.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_svdvals.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/zeros.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/adamw.h"
#include "optimizers/chained.h"
#include "optimizers/muon.h"
#include "optimizers/slot_optimizer.h"
#include "optimizers/state.h"

namespace orthoshard::optimizers {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

// Deterministic pseudo-random values: sin of a quadratic phase (full rank as a matrix).
at::Tensor Det(std::vector<int64_t> shape, double seed, double scale = 1.0) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const at::Tensor x = at::arange(n, at::kFloat);
  const at::Tensor phase = at::mul(x, x).mul_(0.0113).add_(x, 0.7311).add_(seed);
  return at::mul(at::sin(phase), scale).reshape(shape);
}

// Equal names, offsets and bitwise-equal tensors, ignoring the record named `ignore`.
bool StatesEqual(const std::vector<StateRecord>& a, const std::vector<StateRecord>& b,
                 const std::string& ignore = "") {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].offset != b[i].offset) return false;
    if (a[i].name != ignore && !at::equal(a[i].tensor, b[i].tensor)) return false;
  }
  return true;
}

// The record named `name` as a tensor of its full shape (a whole-param slot exports the whole).
at::Tensor Record(const std::vector<StateRecord>& state, const std::string& name) {
  for (const StateRecord& r : state) {
    if (r.name == name) return r.tensor.view(r.full_shape);
  }
  ADD_FAILURE() << "no record " << name;
  return at::Tensor();
}

std::vector<StateRecord> Export(const SlotOptimizer& opt) {
  std::vector<StateRecord> out;
  opt.ExportState(out);
  return out;
}

class OptimizersTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(OptimizersTest, MuonLrScaleRules) {
  MuonHyper hp;
  hp.scale_rule = MuonScaleRule::kOriginal;
  EXPECT_DOUBLE_EQ(MuonLrScale(64, 16, hp), 2.0);
  EXPECT_DOUBLE_EQ(MuonLrScale(16, 64, hp), 1.0);
  hp.scale_rule = MuonScaleRule::kMatchRmsAdamW;
  EXPECT_DOUBLE_EQ(MuonLrScale(16, 64, hp), 0.2 * 8.0);
  hp.scale_rule = MuonScaleRule::kSpectral;
  hp.extra_scale = 0.5;
  EXPECT_DOUBLE_EQ(MuonLrScale(64, 16, hp), 0.5 * 8.0);
}

TEST_F(OptimizersTest, NewtonSchulzOrthogonalisesWithoutTouchingInput) {
  for (NsDType dtype : {NsDType::kBFloat16, NsDType::kFloat32}) {
    NewtonSchulzOptions options;
    options.dtype = dtype;
    const at::Tensor g = Det({24, 40}, 0.3);
    const at::Tensor before = g.clone();
    const at::Tensor o = NewtonSchulz(g, options).to(at::kFloat);
    EXPECT_TRUE(at::equal(g, before));
    // O O^T is near I. g / |g|_F has singular values in [0.0032, 0.372] (measured), which five
    // steps of p(x) = 3.4445 x - 4.7750 x^3 + 2.0315 x^5 map into [0.68, 1.21] in exact
    // arithmetic (p evaluated on a fine grid of that interval). A diagonal entry of O O^T is
    // sum_k sigma_k^2 u_ik^2 with sum_k u_ik^2 = 1, so it lies in [sigma_min^2, sigma_max^2] =
    // [0.46, 1.46]. The iteration pulls sigma back into its band, so bf16's 2^-8 roundings
    // per step do not add up; (0.25, 2.25) leaves a factor of at least 1.5 on either side
    // (measured diag 0.547 .. 1.175).
    const at::Tensor gram = at::mm(o, o.t());
    const at::Tensor diag = gram.diagonal();
    EXPECT_GT(diag.min().item<float>(), 0.25f);
    EXPECT_LT(diag.max().item<float>(), 2.25f);
    // Tall input = transpose of the wide one, bitwise: NewtonSchulz transposes it back to the same
    // row-major [24, 40] matrix and runs the same kernels on it.
    const at::Tensor tall = NewtonSchulz(g.t(), options).to(at::kFloat);
    EXPECT_TRUE(at::equal(tall, o.t()));
  }
}

// Bound on |batched - per-matrix| (elementwise) for an fp32 Newton–Schulz of [m, n] matrices with
// the default coefficients. Both evaluate the same iteration; only the summation order inside a
// matrix product may differ (another GEMM kernel), and the per-matrix Frobenius norm.
//  - Two summation orders of a product with inner dimension k differ by at most 2 γ_k (|A||B|)_ij
//    (Higham, Accuracy and Stability of Numerical Algorithms, §3.5), γ_k = k u / (1 - k u),
//    u = 2^-24, and (|A||B|)_ij <= |row_i A|_2 |col_j B|_2 <= σmax(A) σmax(B).
//  - The iterate starts with Frobenius norm 1 (σ <= 1) and p(σ) = aσ + bσ^3 + cσ^5 maps [0, sx]
//    into itself for sx = 1.21 (max of p on [0, 1] is 1.2024, p(1.21) = 0.94), so σmax(X) <= sx,
//    σmax(A = X X^T) <= sx^2, σmax(bA + cA^2) <= |b| sx^2 + |c| sx^4.
//  - One step's three products then add at most e = 2 γ_k (sx^2 + |c| sx^4 + (|b| sx^2 + |c| sx^4)
//    sx) (A, the c-weighted A^2, the final product); an error carried in is amplified by at most
//    L = max over [0, sx] of |p'(σ)| (first order, per singular value).
//  - Over s steps: δ_s <= δ_0 L^s + e (L^s - 1) / (L - 1), with δ_0 = 2 γ_{mn} (the norm).
double BatchedNsBound(int64_t m, int64_t n, int steps) {
  const double u = std::ldexp(1.0, -24);
  auto gamma = [u](double k) { return k * u / (1 - k * u); };
  const double a = 3.4445, b = -4.7750, c = 2.0315, sx = 1.21;
  double lipschitz = 0;
  for (int i = 0; i <= 1000; ++i) {
    const double x = sx * i / 1000.0;
    lipschitz = std::max(lipschitz, std::abs(a + 3 * b * x * x + 5 * c * x * x * x * x));
  }
  lipschitz *= 1.01;  // the grid's step (p'' is bounded by 60 on [0, sx]: 60 * 0.0012 < 0.01 L)
  const double sa = sx * sx;
  const double e = 2 * gamma(std::max(m, n)) *
                   (sa + std::abs(c) * sa * sa + (std::abs(b) * sa + std::abs(c) * sa * sa) * sx);
  const double ls = std::pow(lipschitz, steps);
  return 2 * gamma(static_cast<double>(m * n)) * ls + e * (ls - 1) / (lipschitz - 1);
}

// Whether this machine's batched GEMMs and per-matrix norms compute each matrix of a stack with
// the same bits as the per-matrix ops NewtonSchulz uses (ATen's CPU bmm runs the per-matrix gemm
// for each matrix; a library batched kernel may block differently). The operands are laid out as
// the two iterations lay them out: the first step reads the (transposed, for tall matrices) view of
// the input, later steps row-major results.
bool BatchedKernelsMatch(const std::vector<at::Tensor>& matrices) {
  const bool tall = matrices.front().size(0) > matrices.front().size(1);
  const at::Tensor stack = at::stack(matrices);
  const at::Tensor x = tall ? stack.transpose(1, 2) : stack;
  const at::Tensor norms = at::linalg_vector_norm(x, 2, at::IntArrayRef{1, 2}, true);
  const at::Tensor first = at::bmm(x, x.transpose(1, 2));
  const at::Tensor row_major = x.contiguous();
  const at::Tensor gram = at::bmm(row_major, row_major.transpose(1, 2));
  const at::Tensor update = at::baddbmm(gram, gram, gram, -4.7750, 2.0315);
  const at::Tensor next = at::baddbmm(row_major, update, row_major, 3.4445);
  const at::Tensor next_first = at::baddbmm(x, update, x, 3.4445);
  for (size_t k = 0; k < matrices.size(); ++k) {
    const int64_t i = static_cast<int64_t>(k);
    const at::Tensor m = tall ? matrices[k].t() : matrices[k];
    const at::Tensor r = m.contiguous();
    const at::Tensor g = at::mm(r, r.t());
    const at::Tensor u = at::addmm(g, g, g, -4.7750, 2.0315);
    if (!at::equal(norms.select(0, i).reshape({}), at::linalg_vector_norm(m, 2)) ||
        !at::equal(first.select(0, i), at::mm(m, m.t())) || !at::equal(gram.select(0, i), g) ||
        !at::equal(update.select(0, i), u) ||
        !at::equal(next.select(0, i), at::addmm(r, u, r, 3.4445)) ||
        !at::equal(next_first.select(0, i), at::addmm(m, u, m, 3.4445))) {
      return false;
    }
  }
  return true;
}

TEST_F(OptimizersTest, BatchedNewtonSchulzMatchesPerMatrix) {
  NewtonSchulzOptions options;
  options.dtype = NsDType::kFloat32;
  for (auto [m, n] : {std::pair<int64_t, int64_t>{48, 80}, {80, 48}, {32, 32}}) {
    std::vector<at::Tensor> matrices;
    for (int k = 0; k < 3; ++k) matrices.push_back(Det({m, n}, 0.4 + k, 1.0 + k));
    const at::Tensor stack = at::stack(matrices);
    const at::Tensor before = stack.clone();
    const at::Tensor batched = NewtonSchulzBatched(stack, options);
    EXPECT_TRUE(at::equal(stack, before));
    ASSERT_EQ(batched.sizes(), stack.sizes());
    // Where the kernels agree, the two iterations are the same arithmetic: equal bits. Elsewhere
    // the derived rounding bound (weak: the iteration may amplify a difference ~L^5 = 1450x).
    const bool same_kernels = BatchedKernelsMatch(matrices);
    const double bound = same_kernels ? 0.0 : BatchedNsBound(m, n, options.ns_steps);
    for (int k = 0; k < 3; ++k) {
      const double diff =
          batched.select(0, k).sub(NewtonSchulz(matrices[k], options)).abs().max().item<double>();
      EXPECT_LE(diff, bound) << m << "x" << n << " matrix " << k
                             << (same_kernels ? " (kernels agree bitwise here)" : "");
    }
  }
}

// Bound on max |X_gram - X_exact| (elementwise) for the Gram form (NsIterateGram) of `steps` steps
// of the default coefficients on a normalised [m, n] X_0 (m <= n, ||X_0||_F = 1), rounding unit u,
// no restart (steps <= kGramRestart). Frobenius norms throughout; |δ(AB)_ij| <= γ_k σmax(A) σmax(B)
// (inner dimension k, Higham §3.5), so an [r, c] product errs by <= sqrt(r c) γ_k σmax(A) σmax(B).
//  - σmax(X_k) <= sx = 1.21 (BatchedNsBound), so σmax(A_k) <= S = sx^2, σmax(p(A_k)) <= Pmax =
//    max |p| on [0, S], σmax(Q_k) <= Pmax^k.
//  - A_{k+1} = f(A_k), f(s) = p(s)^2 s: for symmetric A and symmetric E, the Fréchet derivative of
//    f is E's eigenbasis entries times divided differences of f (Daleckii–Krein), so it grows
//    ||E||_F by at most Lf = max |f'| on [0, S]. Each step's own roundings (A^2; b A + c A^2 and the
//    diagonal add; p A; p (p A)) add at most eA, and δA_0 <= m γ_n.
//  - p(A_k) errs by <= D δA_k + eP (D = max |p'| on [0, S]; eP: its own roundings), Q_{k+1} =
//    p(A_k) Q_k by <= Pmax δQ_k + Pmax^k δP_k + m γ_m Pmax^{k+1}, and X_s = Q_s X_0 by
//    <= δQ_s + sqrt(m n) γ_m Pmax^s.
double GramNsBound(int64_t m, int64_t n, int steps, double u) {
  auto gamma = [u](double k) { return k * u / (1 - k * u); };
  const double a = 3.4445, b = -4.7750, c = 2.0315, sx = 1.21, big_s = sx * sx;
  double pmax = 0, dmax = 0, lf = 0;
  for (int i = 0; i <= 1000; ++i) {
    const double t = big_s * i / 1000.0;
    const double p = a + b * t + c * t * t, dp = b + 2 * c * t;
    pmax = std::max(pmax, std::abs(p));
    dmax = std::max(dmax, std::abs(dp));
    lf = std::max(lf, std::abs(p * p + 2 * t * p * dp));  // f'(s) for f(s) = p(s)^2 s
  }
  // The grid's step is S / 1000; f'' and p'' are bounded by 80 on [0, S], p' by 5: 1% covers it.
  pmax *= 1.01;
  dmax *= 1.01;
  lf *= 1.01;
  const double dm = static_cast<double>(m), gm = gamma(dm);
  const double e_p = dm * (gm * std::abs(c) * big_s * big_s +
                           2 * u * (std::abs(b) * big_s + std::abs(c) * big_s * big_s + a));
  const double e_a = e_p + dm * gm * (pmax * big_s + pmax * pmax * big_s);
  double d_a = dm * gamma(static_cast<double>(n));  // A_0 = X_0 X_0^T
  double d_q = 0, q_norm = 1;
  for (int k = 0; k < steps; ++k) {
    const double d_p = dmax * d_a + e_p;
    d_q = pmax * d_q + q_norm * d_p + dm * gm * pmax * q_norm;
    q_norm *= pmax;
    d_a = lf * d_a + e_a;
  }
  return d_q + std::sqrt(dm * static_cast<double>(n)) * gm * q_norm;
}

// The Gram form is the direct iteration rearranged: in fp64 both agree within the sum of their
// derived rounding bounds (a wrong rearrangement is off by O(0.1)); a restart is exactly a fresh
// Gram run on the iterate (bitwise); NewtonSchulz uses it only where it saves FLOPs and otherwise
// runs the direct form bit for bit; it is refused for the bf16 iteration.
TEST_F(OptimizersTest, GramNewtonSchulzIsTheDirectIterationRearranged) {
  NewtonSchulzOptions options;
  options.dtype = NsDType::kFloat32;
  const double u64 = std::ldexp(1.0, -53);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{24, 64}, {16, 80}, {20, 48}}) {
    at::Tensor x = Det({m, n}, 0.3 + m).to(at::kDouble);
    x = x.div(at::linalg_vector_norm(x, 2));
    const double diff = NsIterateGram(x, options).sub(NsIterateDirect(x, options)).abs().max()
                            .item<double>();
    // BatchedNsBound is for two roundings of the direct form (2 γ): half of it for one.
    const double bound = GramNsBound(m, n, options.ns_steps, u64) +
                         0.5 * BatchedNsBound(m, n, options.ns_steps) * (u64 / std::ldexp(1.0, -24));
    EXPECT_LE(diff, bound) << m << "x" << n;
    // Worst-case bounds are loose (a few 1e-6 here, the diff ~1e-15), but far below what a wrong
    // rearrangement gives (A_{k+1} = p(A) A instead of p(A)^2 A: 1.96 for the 24 x 64 matrix).
    EXPECT_LT(bound, 1e-4) << "the bound must stay meaningful";
    // A stack: the same per matrix.
    const at::Tensor stack = at::stack({x, x.mul(0.5)});
    const at::Tensor stacked = NsIterateGram(stack, options);
    EXPECT_LE(stacked.select(0, 0).sub(NsIterateDirect(x, options)).abs().max().item<double>(),
              bound);
  }
  // Restarts: 12 steps are 5 + 5 + 2 Gram runs, each starting from the last one's iterate.
  {
    at::Tensor x = Det({16, 64}, 0.7);
    x = x.div(at::linalg_vector_norm(x, 2));
    NewtonSchulzOptions twelve = options, five = options, two = options;
    twelve.ns_steps = 12;
    five.ns_steps = 5;
    two.ns_steps = 2;
    EXPECT_TRUE(at::equal(NsIterateGram(x, twelve),
                          NsIterateGram(NsIterateGram(NsIterateGram(x, five), five), two)));
  }
  // Where it applies: the long side at least twice the short one, two steps or more.
  EXPECT_TRUE(GramNewtonSchulzSavesWork(704, 256, 5));
  EXPECT_TRUE(GramNewtonSchulzSavesWork(64, 128, 2));
  EXPECT_FALSE(GramNewtonSchulzSavesWork(384, 256, 5));
  EXPECT_FALSE(GramNewtonSchulzSavesWork(64, 256, 1));
  NewtonSchulzOptions gram = options;
  gram.gram = true;
  const at::Tensor wide = Det({24, 64}, 0.9);
  const at::Tensor normalised = wide.div(at::linalg_vector_norm(wide, 2));
  EXPECT_TRUE(at::equal(NewtonSchulz(wide, gram), NsIterateGram(normalised, options)));
  EXPECT_TRUE(at::equal(NewtonSchulz(wide.t(), gram), NsIterateGram(normalised, options).t()));
  const at::Tensor near_square = Det({48, 80}, 0.2);
  EXPECT_TRUE(at::equal(NewtonSchulz(near_square, gram), NewtonSchulz(near_square, options)));
  MuonHyper hp;
  hp.ns.gram = true;  // with the default bf16 iteration
  EXPECT_THAT(ValidateMuonHyper(hp), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("needs the fp32 iteration")));
  hp.ns.dtype = NsDType::kFloat32;
  EXPECT_OK(ValidateMuonHyper(hp));
}

// A Muon step with batched Newton–Schulz: same-shape matrices across slots and fused blocks are
// orthogonalised together; the params stay within the NS bound (times each step's lr scale) of
// the per-matrix step. Gradients are fixed handles, so differences do not feed back into them.
TEST_F(OptimizersTest, BatchedMuonStepMatchesPerMatrix) {
  auto params = [] {
    return std::vector<Param>{
        Param{"a.weight", Det({16, 8}, 0.1), Det({16, 8}, 1.1, 0.1), {}},
        Param{"b.weight", Det({16, 8}, 0.2), Det({16, 8}, 1.2, 0.1), {}},
        Param{"qkv.weight", Det({24, 8}, 0.3), Det({24, 8}, 1.3, 0.1), {1, {8, 8, 8}}},
        Param{"c.weight", Det({8, 8}, 0.4), Det({8, 8}, 1.4, 0.1), {}},
        Param{"d.weight", Det({8, 24}, 0.5), Det({8, 24}, 1.5, 0.1), {}},
    };
  };
  ChainedConfig config;
  config.muon.ns.dtype = NsDType::kFloat32;
  config.max_grad_norm = 0;
  std::vector<Param> single = params(), batched = params();
  auto per_matrix = ChainedOptimizer::Create(single, config);
  config.muon.ns.batched = true;
  auto together = ChainedOptimizer::Create(batched, config);
  ASSERT_TRUE(per_matrix.ok() && together.ok());
  const int steps = 3;
  for (int step = 0; step < steps; ++step) {
    ASSERT_OK((*per_matrix)->Step().status());
    ASSERT_OK((*together)->Step().status());
  }
  // Per step a param moves by lr * scale * ortho; scale = sqrt(max(1, rows / cols)) <= 2 here.
  // Equal bits where this machine's batched kernels agree with the per-matrix ones (checked on the
  // shapes batched here: [16, 8] (a, b), [8, 8] (qkv's blocks and c)).
  const bool same_kernels =
      BatchedKernelsMatch({Det({16, 8}, 0.1), Det({16, 8}, 0.2)}) &&
      BatchedKernelsMatch({Det({8, 8}, 0.3), Det({8, 8}, 0.4), Det({8, 8}, 0.5)});
  const double bound =
      same_kernels ? 0.0
                   : steps * config.muon.lr * 2.0 * BatchedNsBound(24, 8, config.muon.ns.ns_steps);
  for (size_t i = 0; i < single.size(); ++i) {
    const double diff = single[i].param.sub(batched[i].param).abs().max().item<double>();
    EXPECT_LE(diff, bound) << single[i].name;
  }
  // The momentum buffers do not depend on the orthogonalisation: bitwise equal.
  for (const char* name : {"a.weight", "qkv.weight", "d.weight"}) {
    const std::string field = std::string(name) + "/momentum_buffer";
    EXPECT_TRUE(at::equal(Record((*per_matrix)->ExportState(), field),
                          Record((*together)->ExportState(), field)))
        << field;
  }
}

// Orthogonalising a fused weight per block equals running Muon on each block as its own matrix.
void ExpectSplitMatchesSeparateBlocks(int64_t groups, std::vector<int64_t> block_rows, int64_t cols,
                                      MuonScaleRule rule) {
  int64_t rows_per_group = 0;
  for (int64_t r : block_rows) rows_per_group += r;
  const std::vector<int64_t> shape = {groups * rows_per_group, cols};
  MuonHyper hp;
  hp.lr = 0.02;
  hp.scale_rule = rule;
  const FusedSplit split{groups, block_rows};
  at::Tensor fused = Det(shape, 0.1, 0.05);
  const at::Tensor initial = fused.clone();
  std::vector<at::Tensor> grads = {Det(shape, 1.0), Det(shape, 2.0)};
  auto gather = [&](const at::Tensor& t, size_t j) {
    int64_t offset = 0;
    for (size_t k = 0; k < j; ++k) offset += block_rows[k];
    return t.view({groups, rows_per_group, cols})
        .narrow(1, offset, block_rows[j])
        .reshape({groups * block_rows[j], cols})
        .clone();
  };
  // Gradients are handles: each step writes the step's gradient into them.
  const at::Tensor fused_grad = at::zeros_like(fused);
  std::vector<Muon::Entry> block_entries;
  std::vector<at::Tensor> blocks, block_grads;
  for (size_t j = 0; j < block_rows.size(); ++j) {
    blocks.push_back(gather(initial, j));
    block_grads.push_back(at::zeros_like(blocks.back()));
    block_entries.push_back(
        {Slot::Whole("block" + std::to_string(j), blocks.back(), block_grads.back()), hp, {}});
  }
  auto fused_opt = Muon::Create({{Slot::Whole("fused", fused, fused_grad), hp, split}});
  auto block_opt = Muon::Create(std::move(block_entries));
  ASSERT_TRUE(fused_opt.ok()) << fused_opt.status();
  ASSERT_TRUE(block_opt.ok()) << block_opt.status();
  for (size_t s = 0; s < grads.size(); ++s) {
    fused_grad.copy_(grads[s]);
    for (size_t j = 0; j < block_rows.size(); ++j) block_grads[j].copy_(gather(grads[s], j));
    ASSERT_TRUE((*fused_opt)->Step({}).ok());
    ASSERT_TRUE((*block_opt)->Step({}).ok());
  }
  // Bitwise: each block is orthogonalised from an equal contiguous copy of the same shape by the
  // same kernels, and the elementwise momentum and update run the same float ops per element.
  for (size_t j = 0; j < block_rows.size(); ++j) {
    EXPECT_TRUE(at::equal(gather(fused, j), blocks[j])) << "block " << j;
  }
  // And it is not what orthogonalising the whole fused matrix gives.
  at::Tensor whole = initial.clone();
  const at::Tensor whole_grad = at::zeros_like(whole);
  auto whole_opt = Muon::Create({{Slot::Whole("whole", whole, whole_grad), hp, {}}});
  ASSERT_TRUE(whole_opt.ok());
  for (const at::Tensor& g : grads) {
    whole_grad.copy_(g);
    ASSERT_TRUE((*whole_opt)->Step({}).ok());
  }
  EXPECT_FALSE(at::allclose(whole, fused, 1e-3, 1e-4));
}

TEST_F(OptimizersTest, FusedQkvIsOrthogonalisedPerProjection) {
  // 2 query groups, 2 query heads per group, head dim 4: per group [q: 8, k: 4, v: 4] rows.
  ExpectSplitMatchesSeparateBlocks(2, {8, 4, 4}, 16, MuonScaleRule::kMatchRmsAdamW);
}

TEST_F(OptimizersTest, SwigluGateAndUpAreTwoMatrices) {
  ExpectSplitMatchesSeparateBlocks(1, {24, 24}, 16, MuonScaleRule::kOriginal);
}

TEST_F(OptimizersTest, Bf16ParamsUseFp32MainParams) {
  const at::Tensor init = Det({16, 12}, 0.5).to(at::kBFloat16);
  const at::Tensor grad = Det({16, 12}, 1.5).to(at::kBFloat16);
  for (bool use_muon : {false, true}) {
    at::Tensor model = init.clone();
    at::Tensor reference = init.to(at::kFloat);
    std::unique_ptr<SlotOptimizer> mixed, plain;
    if (use_muon) {
      mixed = *Muon::Create({{Slot::Whole("w", model, grad), MuonHyper{}, {}}});
      plain = *Muon::Create({{Slot::Whole("w", reference, grad.to(at::kFloat)), MuonHyper{}, {}}});
    } else {
      mixed = *AdamW::Create({{Slot::Whole("w", model, grad), AdamWHyper{}}});
      plain = *AdamW::Create({{Slot::Whole("w", reference, grad.to(at::kFloat)), AdamWHyper{}}});
    }
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(mixed->Step({}).ok());
      ASSERT_TRUE(plain->Step({}).ok());
    }
    const std::vector<StateRecord> state = Export(*mixed);
    ASSERT_EQ(state.back().name, "w/main_param");
    EXPECT_TRUE(at::equal(Record(state, "w/main_param"), reference)) << mixed->kind();
    EXPECT_TRUE(at::equal(model, reference.to(at::kBFloat16))) << mixed->kind();
    EXPECT_EQ(model.scalar_type(), at::kBFloat16);
  }
}

std::vector<Param> ToyParams() {
  return {
      Param{"embed.weight", Det({20, 8}, 0.1), Det({20, 8}, 1.1, 0.1), {}},
      Param{"layers.0.norm.weight", Det({8}, 0.2), Det({8}, 1.2, 0.1), {}},
      Param{"layers.0.fc1.weight", Det({16, 8}, 0.3), Det({16, 8}, 1.3, 0.1), {}},
      Param{"layers.0.fc2.weight", Det({8, 16}, 0.4), Det({8, 16}, 1.4, 0.1), {}},
      Param{"layers.0.fc2.bias", Det({8}, 0.5), Det({8}, 1.5, 0.1), {}},
  };
}

TEST_F(OptimizersTest, ChainedRoutesAndReports) {
  auto chained = ChainedOptimizer::Create(ToyParams(), ChainedConfig{});
  ASSERT_TRUE(chained.ok()) << chained.status();
  const RoutingReport& r = (*chained)->routing_report();
  EXPECT_EQ(r.muon_count, 2);
  EXPECT_EQ(r.muon_numel, 256);
  EXPECT_EQ(r.adamw_count, 3);
  EXPECT_EQ(r.adamw_numel, 176);
  EXPECT_EQ((*chained)->muon().num_slots(), 2);
  EXPECT_EQ((*chained)->muon().numel(), 256);
  EXPECT_EQ((*chained)->adamw().numel(), 176);
}

TEST_F(OptimizersTest, NonFiniteStepLeavesEveryStateUntouched) {
  std::vector<Param> params = ToyParams();
  std::vector<at::Tensor> model;
  for (const Param& p : params) model.push_back(p.param);
  ChainedConfig config;
  config.clip_mode = ClipMode::kExcludeMuon;  // Muon grads are still checked for finiteness
  auto chained = ChainedOptimizer::Create(params, config);
  ASSERT_TRUE(chained.ok());
  ASSERT_TRUE((*chained)->Step().ok());  // non-zero momentum and moments first
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : model) before.push_back(t.clone());
  const std::vector<StateRecord> state_before = (*chained)->ExportState();
  for (const int bad : {2, 0}) {  // layers.0.fc1.weight (Muon), embed.weight (AdamW)
    const at::Tensor grad = params[bad].grad;
    const at::Tensor good = grad.clone();
    grad[1][2] = bad == 0 ? std::nan("") : INFINITY;
    auto result = (*chained)->Step();
    ASSERT_TRUE(result.ok());
    EXPECT_TRUE(result->skipped) << bad;
    EXPECT_TRUE(StatesEqual((*chained)->ExportState(), state_before, "chained/skipped_steps"))
        << bad;
    for (size_t i = 0; i < model.size(); ++i) EXPECT_TRUE(at::equal(model[i], before[i])) << bad;
    grad.copy_(good);
  }
  EXPECT_EQ((*chained)->skipped_steps(), 2);
  EXPECT_EQ((*chained)->steps_taken(), 1);
  auto result = (*chained)->Step();
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->skipped);
  EXPECT_EQ((*chained)->steps_taken(), 2);
}

// First-step moments reveal the gradient scale each optimizer saw: exp_avg = (1 - beta1) * s * g,
// momentum_buffer = (1 - mu) * s * g.
TEST_F(OptimizersTest, ClipModes) {
  for (ClipMode mode : {ClipMode::kAllBeforeMomentum, ClipMode::kExcludeMuon}) {
    std::vector<Param> params = ToyParams();
    ChainedConfig config;
    config.max_grad_norm = 0.05;
    config.clip_mode = mode;
    auto chained = ChainedOptimizer::Create(params, config);
    ASSERT_TRUE(chained.ok());
    auto stats = (*chained)->LocalGradStats();
    ASSERT_TRUE(stats.ok());
    // Computed as GradSumSquares does (an fp32 norm per grad, squared and summed in double,
    // AdamW's params in the order embed, norm, bias and Muon's fc1, fc2), so equal bits.
    double adamw_ss = 0.0, muon_ss = 0.0;
    for (size_t i = 0; i < params.size(); ++i) {
      const double norm =
          at::linalg_vector_norm(params[i].grad, 2, c10::nullopt, false, at::kFloat)
              .item<double>();
      (i == 2 || i == 3 ? muon_ss : adamw_ss) += norm * norm;
    }
    EXPECT_EQ(stats->adamw_sum_squares, adamw_ss);
    EXPECT_EQ(stats->muon_sum_squares, muon_ss);
    auto result = (*chained)->Step();
    ASSERT_TRUE(result.ok());
    const bool all = mode == ClipMode::kAllBeforeMomentum;
    // DecideStep's own expressions on the same doubles: equal bits.
    const double norm =
        std::sqrt(stats->adamw_sum_squares + (all ? stats->muon_sum_squares : 0.0));
    EXPECT_EQ(result->grad_norm, norm);
    const double scale = 0.05 / (norm + 1e-6);
    EXPECT_EQ(result->clip_scale, scale);
    // The optimizers scale the grad in fp32 (float(s) and the product: 2 roundings) and lerp from
    // zero (float(1 - beta) and the product: 2 more); the expectation rounds (1 - beta) * s to
    // float and one product: 2. The exact values agree, so the two differ by at most 6 roundings
    // of 2^-24 relative plus second-order terms: rtol 8 * 2^-24, and atol 0 as the bound is
    // relative for every element (nothing cancels). Measured: at most 2.2 * 2^-24.
    const double rtol = 8 * 0x1p-24;
    const std::vector<StateRecord> state = (*chained)->ExportState();
    EXPECT_TRUE(at::allclose(Record(state, "embed.weight/exp_avg"),
                             at::mul(params[0].grad, 0.1 * scale), rtol, 0.0));
    const double muon_scale = all ? scale : 1.0;
    EXPECT_TRUE(at::allclose(Record(state, "layers.0.fc1.weight/momentum_buffer"),
                             at::mul(params[2].grad, 0.05 * muon_scale), rtol, 0.0));
  }
}

// The clip-and-skip rule both chained optimizers (local and distributed) share.
TEST(DecideStepTest, ClipsSkipsAndSchedules) {
  ChainedConfig config;
  config.max_grad_norm = 1.0;
  config.schedule.warmup_steps = 4;
  StepResult r = DecideStep(config, GradStats{9.0, 16.0, false}, 1);
  EXPECT_FALSE(r.skipped);
  EXPECT_DOUBLE_EQ(r.grad_norm, 5.0);
  EXPECT_DOUBLE_EQ(r.clip_scale, 1.0 / (5.0 + 1e-6));
  EXPECT_DOUBLE_EQ(r.lr_multiplier, 0.5);  // warmup step 1 of 4: (1 + 1) / 4
  EXPECT_DOUBLE_EQ(MuonClipScale(config, r), r.clip_scale);

  config.clip_mode = ClipMode::kExcludeMuon;
  r = DecideStep(config, GradStats{0.25, 16.0, false}, 1);
  EXPECT_DOUBLE_EQ(r.grad_norm, 0.5);
  EXPECT_DOUBLE_EQ(r.clip_scale, 1.0);  // 1 / (0.5 + 1e-6) > 1: no clipping
  EXPECT_DOUBLE_EQ(MuonClipScale(config, r), 1.0);

  config.max_grad_norm = 0.0;  // clipping off
  EXPECT_DOUBLE_EQ(DecideStep(config, GradStats{1e6, 0.0, false}, 9).clip_scale, 1.0);

  // Not finite anywhere, even only in the excluded Muon sum, or on another rank: skipped.
  for (const GradStats& stats : {GradStats{NAN, 1.0, false}, GradStats{1.0, INFINITY, false},
                                 GradStats{1.0, 1.0, true}}) {
    r = DecideStep(config, stats, 3);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(r.lr_multiplier, 0.0);
  }
}

// Non-matrix AdamW params (norms, biases) form their own group with their own weight decay.
TEST_F(OptimizersTest, ChainedNonMatrixGroupWeightDecay) {
  for (double wd : {0.0, 0.5}) {
    std::vector<Param> params = ToyParams();
    for (Param& p : params) p.grad = at::zeros_like(p.param);  // only weight decay moves params
    const at::Tensor bias = params[4].param, embed = params[0].param;
    const at::Tensor bias0 = bias.clone(), embed0 = embed.clone();
    ChainedConfig config;
    config.max_grad_norm = 0.0;
    config.adamw.lr = 0.1;
    config.adamw.weight_decay = 0.2;
    config.adamw_non_matrix_weight_decay = wd;
    auto chained = ChainedOptimizer::Create(params, config);
    ASSERT_TRUE(chained.ok());
    ASSERT_TRUE((*chained)->Step().ok());
    // Bitwise: AdamW multiplies by the same double 1 - lr * wd (as a float, like at::mul), and
    // with zero grads its update adds an exact zero (0 / (sqrt(0) + eps) * -step_size).
    EXPECT_TRUE(at::equal(bias, at::mul(bias0, 1.0 - 0.1 * wd)));
    EXPECT_TRUE(at::equal(embed, at::mul(embed0, 1.0 - 0.1 * 0.2)));
  }
}

// no_weight_decay_patterns: a matching param keeps its value under zero gradients, whichever
// optimizer updates it; the others decay as configured.
TEST_F(OptimizersTest, ChainedNoWeightDecayPatterns) {
  std::vector<Param> params = ToyParams();
  for (Param& p : params) p.grad = at::zeros_like(p.param);  // only weight decay moves params
  std::vector<at::Tensor> before;
  for (const Param& p : params) before.push_back(p.param.clone());
  ChainedConfig config;
  config.max_grad_norm = 0.0;
  config.adamw.lr = 0.1;
  config.adamw.weight_decay = 0.2;
  config.muon.lr = 0.1;
  config.muon.weight_decay = 0.3;
  config.no_weight_decay_patterns = {"embed*", "*.fc1.*"};
  auto chained = ChainedOptimizer::Create(params, config);
  ASSERT_TRUE(chained.ok()) << chained.status();
  ASSERT_TRUE((*chained)->Step().ok());
  // embed (AdamW) and fc1 (Muon) match: unchanged (AdamW and Muon add exact zeros for zero grads:
  // Newton-Schulz of a zero matrix is zero, its norm clamped at eps). fc2 (Muon) decays.
  EXPECT_TRUE(at::equal(params[0].param, before[0]));
  EXPECT_TRUE(at::equal(params[2].param, before[2]));
  EXPECT_TRUE(at::equal(params[3].param, at::mul(before[3], 1.0 - 0.1 * 0.3)));
}

// ChainedConfig::params_norm / count_zero_grads: the statistics carry the norm of the params
// entering the step and the count of exactly-zero gradient elements, over both optimizers.
TEST_F(OptimizersTest, ChainedDiagnostics) {
  std::vector<Param> params = ToyParams();
  params[0].grad.narrow(0, 0, 3).zero_();  // 3 x 8 zeros in the embedding (AdamW)
  params[3].grad.narrow(1, 0, 2).zero_();  // 8 x 2 zeros in fc2 (Muon)
  double want_sum_squares = 0.0;
  for (const Param& p : params) {
    const double n = at::linalg_vector_norm(p.param, 2).item<double>();
    want_sum_squares += n * n;
  }
  ChainedConfig config;
  config.params_norm = true;
  config.count_zero_grads = true;
  auto chained = ChainedOptimizer::Create(params, config);
  ASSERT_TRUE(chained.ok()) << chained.status();
  auto result = (*chained)->Step();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->stats.zero_grads, 3 * 8 + 8 * 2);
  // The same fp32 norms per param, added in the same order (AdamW's params first, then Muon's,
  // as in ToyParams): the sums may differ only by the order of two additions.
  EXPECT_NEAR(result->stats.param_sum_squares, want_sum_squares, 1e-12 * want_sum_squares);
  config.params_norm = config.count_zero_grads = false;  // off: nothing counted
  auto plain = ChainedOptimizer::Create(ToyParams(), config);
  ASSERT_TRUE(plain.ok());
  auto off = (*plain)->Step();
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->stats.zero_grads, 0.0);
  EXPECT_EQ(off->stats.param_sum_squares, 0.0);
}

// ParseNsSchedule: names, lists, and errors that name the text.
TEST(NsScheduleTest, NamesListsAndErrors) {
  auto simple = ParseNsSchedule("simple");
  ASSERT_TRUE(simple.ok());
  EXPECT_EQ(simple->coefficients, (std::vector<NsCoefficients>{{3.4445, -4.7750, 2.0315}}));
  EXPECT_EQ(simple->norm_scale, 1.0);
  EXPECT_EQ(NewtonSchulzOptions{}.coefficients, simple->coefficients);  // the default
  auto polar = ParseNsSchedule("polar_express");
  ASSERT_TRUE(polar.ok());
  EXPECT_EQ(polar->coefficients.size(), 5u);
  EXPECT_EQ(polar->norm_scale, 1.02);
  auto list = ParseNsSchedule("2,-1.5,0.5; 3, -3.2,1.2");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->coefficients, (std::vector<NsCoefficients>{{2, -1.5, 0.5}, {3, -3.2, 1.2}}));
  for (const char* bad : {"", "1,2", "a,b,c", "1,2,inf", "1,2,3;", "cubic", "Quintic", "aol4",
                          "1e39,-4.775,2.0315", "1e300,1,1", "3,-3.2,1.2;1,1,-1025"}) {
    EXPECT_THAT(ParseNsSchedule(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("coefficients '", bad, "'"))))
        << bad;
  }
  EXPECT_THAT(ParseNsSchedule("1e30,-4.775,2.0315"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("coefficient 1e+30 is outside the accepted [-1024, 1024]")));
  EXPECT_TRUE(ParseNsSchedule("1024,-1024,-1024").ok());
}

// The singular-value bound over the iterations: exact for the published schedules (their
// overshoot above 1), a refusal naming the iteration for schedules that leave [0, 16], and
// Muon's own validation applying it.
TEST(NsScheduleTest, SingularValuesStayBounded) {
  auto simple = ParseNsSchedule("simple");
  auto polar = ParseNsSchedule("polar_express");
  ASSERT_TRUE(simple.ok() && polar.ok());
  // simple: max of 3.4445 s - 4.775 s^3 + 2.0315 s^5 on [0, 1], at s^2 = 0.3075..., every step.
  EXPECT_NEAR(NsSingularValueBound(simple->coefficients, 1.0, 99), 1.20237, 1e-5);
  // polar_express: its first quintic overshoots to 1.99 (from [0, 1 / 1.02]), later ones less.
  EXPECT_NEAR(NsSingularValueBound(polar->coefficients, 1.02, 99), 1.99168, 1e-5);
  EXPECT_TRUE(CheckNsScheduleBounded(polar->coefficients, 1.02, 99).ok());
  EXPECT_EQ(NsSingularValueBound({{2, 0, 0}}, 1.0, 4), 16.0);  // doubles every step
  EXPECT_TRUE(CheckNsScheduleBounded({{2, 0, 0}}, 1.0, 4).ok());
  EXPECT_THAT(CheckNsScheduleBounded({{2, 0, 0}}, 1.0, 5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Newton-Schulz iteration 5 of 5 (2, 0, 0) can raise a singular "
                                 "value in [0, 16] to 32; accepted: schedules that keep them "
                                 "within [0, 16]")));
  // Bounded on [0, 1] but not beyond: 3.4445 s - 4.775 s^3 + 4 s^5 reaches 2.67, then 460.
  EXPECT_THAT(CheckNsScheduleBounded({{3.4445, -4.775, 4}}, 1.0, 5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("iteration 2 of 5")));
  EXPECT_TRUE(std::isinf(NsSingularValueBound({{1000, 1000, 1000}}, 1.0, 99)));
  MuonHyper hp;
  hp.ns.coefficients = {{3.4445, -4.775, 4}};
  EXPECT_THAT(ValidateMuonHyper(hp), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("Muon: Newton-Schulz iteration 2 of 5")));
  hp.ns.coefficients = {{1e39, 0, 0}};
  EXPECT_THAT(ValidateMuonHyper(hp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Muon: Newton-Schulz coefficients must be in [-1024, 1024], "
                                 "got 1e+39")));
  hp.ns.coefficients = {{3.4445, -4.775, 2.0315}};
  hp.ns.ns_steps = 99;
  EXPECT_TRUE(ValidateMuonHyper(hp).ok());
}

// Megatron-LM's quintic and aol: the digits of FACTS.md (NVIDIA Emerging-Optimizers' muon_utils.py
// _COEFFICIENT_SETS), Frobenius normalisation (norm_scale 1), cycled; the bound over each table's
// own iteration count, whole cycles only, and aol refused past one cycle (its restart flips).
TEST(NsScheduleTest, MegatronQuinticAndAolTables) {
  auto quintic = ParseNsSchedule("quintic");
  auto aol = ParseNsSchedule("aol");
  ASSERT_TRUE(quintic.ok() && aol.ok());
  EXPECT_EQ(quintic->coefficients, (std::vector<NsCoefficients>{{4.0848, -6.8946, 2.9270},
                                                                {3.9505, -6.3029, 2.6377},
                                                                {3.7418, -5.5913, 2.3037},
                                                                {2.8769, -3.1427, 1.2046},
                                                                {2.8366, -3.0525, 1.2012}}));
  EXPECT_EQ(aol->coefficients, (std::vector<NsCoefficients>{{4.0098, -7.0585, 2.4635},
                                                            {3.4585, -5.5479, 2.5959},
                                                            {2.7573, -3.2939, 1.4254},
                                                            {2.7215, -3.0494, 1.3169}}));
  for (const NsSchedule* t : {&*quintic, &*aol}) {
    EXPECT_EQ(t->norm_scale, 1.0);
    EXPECT_TRUE(t->cycle);
  }
  EXPECT_EQ(NsCoefficientIndex(4, 5, /*cycle=*/true), 1u);
  EXPECT_EQ(NsCoefficientIndex(4, 5, /*cycle=*/false), 3u);
  // The largest singular value of the iterate: quintic's first triple overshoots to 1.2731 and
  // aol's to 1.2084 (p(s) at its maximum in [0, 1], computed in double by the exact critical
  // points; a dense sampling of [0, 1] in Python agrees to 1e-9).
  EXPECT_NEAR(NsSingularValueBound(quintic->coefficients, 1.0, 5, true), 1.273143, 1e-5);
  EXPECT_NEAR(NsSingularValueBound(aol->coefficients, 1.0, 4, true), 1.208422, 1e-5);
  EXPECT_TRUE(CheckNsScheduleBounded(quintic->coefficients, 1.0, 5, true).ok());
  EXPECT_TRUE(CheckNsScheduleBounded(quintic->coefficients, 1.0, 10, true).ok());
  EXPECT_TRUE(CheckNsScheduleBounded(aol->coefficients, 1.0, 4, true).ok());
  EXPECT_THAT(CheckNsScheduleBounded(quintic->coefficients, 1.0, 7, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a table of 5 Newton-Schulz iterations that restarts after its "
                                 "last (cycled) over 7 iterations")));
  EXPECT_THAT(CheckNsScheduleBounded(aol->coefficients, 1.0, 5, true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a multiple of 4")));
  // A second cycle meets the converged singular values (up to 1.084) with p(s) = 4.0098 s -
  // 7.0585 s^3 + 2.4635 s^5, negative above its root 0.8837: refused by the sign rule.
  EXPECT_THAT(CheckNsScheduleBounded(aol->coefficients, 1.0, 8, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Newton-Schulz iteration 5 of 8 (4.0098, -7.0585, 2.4635) is -")));
  // Without the cycle the last triple repeats, as for an explicit list.
  EXPECT_TRUE(CheckNsScheduleBounded(aol->coefficients, 1.0, 5, false).ok());
  NewtonSchulzOptions ns;
  ASSERT_TRUE(SetNsSchedule("aol", &ns).ok());
  EXPECT_TRUE(ns.cycle);
  MuonHyper hp;
  hp.ns = ns;
  EXPECT_THAT(ValidateMuonHyper(hp), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("Muon: a table of 4 Newton-Schulz")));
  hp.ns.ns_steps = 4;
  EXPECT_TRUE(ValidateMuonHyper(hp).ok());
}

// p_{steps-1}(... p_0(s)) in double: where Newton-Schulz sends a singular value s of the
// normalised input (the iteration acts on each singular value alone: X = U S V^T gives
// X X^T X = U S^3 V^T).
double ComposedQuintic(const NewtonSchulzOptions& ns, double s) {
  for (int i = 0; i < ns.ns_steps; ++i) {
    const auto [a, b, c] =
        ns.coefficients[NsCoefficientIndex(ns.coefficients.size(), i, ns.cycle)];
    s = a * s + b * s * s * s + c * s * s * s * s * s;
  }
  return s;
}

// Muon with quintic (5 iterations) and aol (4) orthogonalises: on a full-rank matrix every singular
// value of the fp32 iteration's output is the composed quintic of the input's, and lies in the
// table's band, the range of the composition over s in [0.02, 0.8] (sampled in double: quintic
// [0.97775, 1.03178], aol [0.98736, 1.08197]; the input's normalised singular values are in
// [0.05, 0.6]). The tolerance: fp32 products of unit-norm rows round each iterate by about
// 1e-7 x sqrt(64), and 5 iterations of slope at most ~2.3 near the band amplify that below 1e-4.
// Then aol's hazard: a rank-1 matrix (s = 1) comes out as -0.9935 u v^T, its direction reversed.
TEST(NewtonSchulzTest, MegatronTablesOrthogonalise) {
  struct Table {
    const char* name;
    int steps;
    double low, high;
  };
  const at::Tensor g = Det({64, 32}, 0.3);
  const at::Tensor input = at::linalg_svdvals(g.to(at::kDouble)).div(at::linalg_vector_norm(g, 2)
                                                                           .to(at::kDouble));
  ASSERT_GT(input.min().item<double>(), 0.02);
  ASSERT_LT(input.max().item<double>(), 0.8);
  for (const Table& t : {Table{"quintic", 5, 0.97775, 1.03178}, Table{"aol", 4, 0.98736, 1.08197}}) {
    NewtonSchulzOptions ns;
    ASSERT_TRUE(SetNsSchedule(t.name, &ns).ok());
    ns.ns_steps = t.steps;
    ns.dtype = NsDType::kFloat32;
    const at::Tensor out = at::linalg_svdvals(NewtonSchulz(g, ns).to(at::kDouble));
    // The composition is not monotonic: compare sorted values, as svdvals returns them.
    std::vector<double> composed;
    for (int64_t i = 0; i < input.numel(); ++i) {
      composed.push_back(ComposedQuintic(ns, input[i].item<double>()));
    }
    std::sort(composed.rbegin(), composed.rend());
    for (int64_t i = 0; i < out.numel(); ++i) {
      const double s = out[i].item<double>();
      EXPECT_NEAR(s, composed[i], 1e-4) << t.name << " " << i;
      EXPECT_GE(s, t.low - 1e-4) << t.name;
      EXPECT_LE(s, t.high + 1e-4) << t.name;
    }
  }
  NewtonSchulzOptions aol;
  ASSERT_TRUE(SetNsSchedule("aol", &aol).ok());
  aol.ns_steps = 4;
  aol.dtype = NsDType::kFloat32;
  const at::Tensor u = Det({16, 1}, 0.1), v = Det({1, 24}, 0.2);
  const at::Tensor rank1 = at::mm(u, v);
  const at::Tensor unit = rank1.div(at::linalg_vector_norm(rank1, 2));  // u v^T / (|u| |v|)
  EXPECT_NEAR(ComposedQuintic(aol, 1.0), -0.99352, 1e-5);
  EXPECT_TRUE(at::allclose(NewtonSchulz(rank1, aol), unit.mul(ComposedQuintic(aol, 1.0)), 0,
                           1e-4));
}

TEST_F(OptimizersTest, ScheduleDrivesLr) {
  ChainedConfig config;
  config.schedule = {ScheduleKind::kWarmupCosine, 2, 6, 0, 0.1};
  auto chained = ChainedOptimizer::Create(ToyParams(), config);
  ASSERT_TRUE(chained.ok());
  for (int s = 0; s < 4; ++s) {
    auto result = (*chained)->Step();
    ASSERT_TRUE(result.ok());
    EXPECT_DOUBLE_EQ(result->lr_multiplier, LrMultiplier(config.schedule, s));
  }
}

TEST_F(OptimizersTest, StateRoundTripResumesBitwise) {
  auto make = [](std::vector<Param> params) {
    params[2].param = params[2].param.to(at::kBFloat16);  // one bf16 model param with a main param
    return ChainedOptimizer::Create(std::move(params), ChainedConfig{});
  };
  std::vector<Param> a_params = ToyParams();
  auto a = make(a_params);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*a)->Step().ok());
  const std::vector<StateRecord> saved = (*a)->ExportState();
  EXPECT_EQ(saved.size(), 3 * 3 + 2 + 1 + 2);  // AdamW 3 fields x 3, Muon 2 buffers + 1 main, 2
  // A fresh optimizer over (copies of) the same model params, resumed from the export.
  std::vector<Param> b_params = ToyParams();
  auto b = make(b_params);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->ImportState(saved).ok());
  EXPECT_TRUE(StatesEqual((*b)->ExportState(), saved));
  EXPECT_EQ((*b)->steps_taken(), 2);
  // Model params are not optimizer state; bring b's fp32 ones in line as a checkpoint load would.
  for (size_t i = 0; i < a_params.size(); ++i) {
    if (i != 2) b_params[i].param.copy_(a_params[i].param);
  }
  ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*b)->Step().ok());
  EXPECT_TRUE(StatesEqual((*b)->ExportState(), (*a)->ExportState()));
}

// Params of no elements next to others (torch.optim accepts them): the optimizer steps, exports
// their empty state tensors and counters like any other param's, and imports its own export,
// resuming bitwise; a collection holding every record twice (two ranks' exports) imports too.
TEST_F(OptimizersTest, EmptyParamsRoundTripTheirState) {
  const auto params = [] {
    std::vector<Param> p = ToyParams();
    p.push_back(Param{"layers.0.fc3.weight", at::zeros({0, 7}), at::zeros({0, 7}), {}});  // Muon
    p.push_back(Param{"layers.0.fc3.bias", at::zeros({0}), at::zeros({0}), {}});          // AdamW
    p.push_back(Param{"layers.0.fc4.weight", at::zeros({7, 0}, at::kBFloat16),
                      at::zeros({7, 0}, at::kBFloat16), {}});  // Muon, with an fp32 main param
    return p;
  };
  std::vector<Param> a_params = params();
  auto a = ChainedOptimizer::Create(a_params, ChainedConfig{});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->routing_report().muon_count, 4);
  ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*a)->Step().ok());
  const std::vector<StateRecord> saved = (*a)->ExportState();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const StateRecord& r : saved) shapes[r.name] = r.full_shape;
  EXPECT_EQ(shapes["layers.0.fc3.weight/momentum_buffer"], (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(shapes["layers.0.fc3.bias/exp_avg"], (std::vector<int64_t>{0}));
  EXPECT_EQ(shapes["layers.0.fc3.bias/exp_avg_sq"], (std::vector<int64_t>{0}));
  EXPECT_EQ(shapes["layers.0.fc4.weight/main_param"], (std::vector<int64_t>{7, 0}));
  ASSERT_TRUE(shapes.count("layers.0.fc3.bias/step"));
  for (const StateRecord& r : saved) {
    if (r.name == "layers.0.fc3.bias/step") {
      EXPECT_EQ(r.tensor.item<int64_t>(), 2);
    }
  }
  // AdamW 3 fields x 3, Muon 2 buffers, 2 counters; then the empty params' 1 + 3 + 2 records.
  EXPECT_EQ(saved.size(), 3 * 3 + 2 + 2 + (1 + 3 + 2));

  std::vector<Param> b_params = params();
  auto b = ChainedOptimizer::Create(b_params, ChainedConfig{});
  ASSERT_TRUE(b.ok());
  const absl::Status imported = (*b)->ImportState(saved);
  ASSERT_TRUE(imported.ok()) << imported;
  EXPECT_TRUE(StatesEqual((*b)->ExportState(), saved));
  std::vector<StateRecord> twice = saved;
  twice.insert(twice.end(), saved.begin(), saved.end());
  const absl::Status imported_twice = (*b)->ImportState(twice);
  ASSERT_TRUE(imported_twice.ok()) << imported_twice;
  for (size_t i = 0; i < a_params.size(); ++i) b_params[i].param.copy_(a_params[i].param);
  ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*b)->Step().ok());
  EXPECT_TRUE(StatesEqual((*b)->ExportState(), (*a)->ExportState()));
}

// A staged step (StepStages) updates exactly what an unstaged one does, bitwise, stage by stage:
// each stage's slots are updated before on_done(stage), later stages' not yet; every stage is
// reported in order, empty ones included.
TEST_F(OptimizersTest, StagedStepEqualsTheWholeStep) {
  std::vector<Param> whole_params = ToyParams(), staged_params = ToyParams();
  auto whole = ChainedOptimizer::Create(whole_params, ChainedConfig{});
  auto staged = ChainedOptimizer::Create(staged_params, ChainedConfig{});
  ASSERT_TRUE(whole.ok() && staged.ok());
  // Stages in reverse param order with an empty stage 1: embed (0) -> 4, norm (1) -> 3,
  // fc1 (2) -> 3, fc2 (3) -> 2, bias (4) -> 0.
  const std::map<std::string, int> stage_of = {{"embed.weight", 4},
                                               {"layers.0.norm.weight", 3},
                                               {"layers.0.fc1.weight", 3},
                                               {"layers.0.fc2.weight", 2},
                                               {"layers.0.fc2.bias", 0}};
  std::vector<at::Tensor> before;
  for (const Param& p : staged_params) before.push_back(p.param.clone());
  std::vector<int> done;
  StepStages stages;
  stages.num_stages = 5;
  stages.stage_of = [&](const Slot& slot) { return stage_of.at(slot.name); };
  stages.on_done = [&](int stage) -> absl::Status {
    done.push_back(stage);
    for (size_t i = 0; i < staged_params.size(); ++i) {
      const int s = stage_of.at(staged_params[i].name);
      const bool updated = !at::equal(staged_params[i].param, before[i]);
      if (updated != (s <= stage)) {
        return absl::InternalError(absl::StrCat("at stage ", stage, " '", staged_params[i].name,
                                                "' (stage ", s, ") updated: ", updated));
      }
    }
    return absl::OkStatus();
  };
  for (int step = 0; step < 2; ++step) {
    done.clear();
    for (size_t i = 0; i < staged_params.size(); ++i) before[i] = staged_params[i].param.clone();
    ASSERT_OK((*whole)->Step().status());
    ASSERT_OK((*staged)->Step(&stages).status());
    EXPECT_EQ(done, (std::vector<int>{0, 1, 2, 3, 4}));
    for (size_t i = 0; i < whole_params.size(); ++i) {
      EXPECT_TRUE(at::equal(whole_params[i].param, staged_params[i].param)) << whole_params[i].name;
    }
    EXPECT_TRUE(StatesEqual((*whole)->ExportState(), (*staged)->ExportState()));
  }
  // A slot outside the stages: an error before anything is updated.
  stages.num_stages = 4;
  for (size_t i = 0; i < staged_params.size(); ++i) before[i] = staged_params[i].param.clone();
  EXPECT_THAT((*staged)->Step(&stages).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("slot 'embed.weight' has stage 4, expected [0, 4)")));
  for (size_t i = 0; i < staged_params.size(); ++i) {
    EXPECT_TRUE(at::equal(staged_params[i].param, before[i])) << staged_params[i].name;
  }
  // on_done's error stops the step.
  stages.num_stages = 5;
  stages.on_done = [](int stage) {
    return stage == 2 ? absl::UnavailableError("peer gone") : absl::OkStatus();
  };
  EXPECT_THAT((*staged)->Step(&stages).status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("peer gone")));
}

// A StepSync that logs what the optimizer told it, staging each slot as `stages` says.
class LoggingStepSync final : public StepSync {
 public:
  LoggingStepSync(std::vector<std::string>* log, std::map<std::string, int> stages, int n)
      : log_(log), stages_(std::move(stages)), n_(n) {}
  int num_stages() const override { return n_; }
  int StageOf(const Slot& slot) const override { return stages_.at(slot.name); }
  absl::Status BeginStep() override { return Log("begin"); }
  absl::Status StageDone(int stage) override { return Log(absl::StrCat("stage ", stage)); }
  absl::Status EndStep() override { return Log("end"); }

 private:
  absl::Status Log(std::string what) {
    log_->push_back(std::move(what));
    return absl::OkStatus();
  }
  std::vector<std::string>* log_;
  std::map<std::string, int> stages_;
  int n_;
};

// The general Create over `params` whole, with `sync`.
absl::StatusOr<std::unique_ptr<ChainedOptimizer>> WithSync(std::vector<Param>& params,
                                                           std::unique_ptr<StepSync> sync) {
  std::vector<ParamDescriptor> descriptors;
  std::vector<Slot> slots;
  for (const Param& p : params) {
    descriptors.push_back({p.name, p.param.sizes().vec()});
    slots.push_back(Slot::Whole(p.name, p.param, p.grad));
  }
  ChainedConfig config;
  auto routing = PlanRouting(config.routing, descriptors);
  if (!routing.ok()) return routing.status();
  return ChainedOptimizer::Create(config, *routing, std::move(slots), {}, nullptr,
                                  std::move(sync));
}

// A StepSync is told every step: BeginStep before the update, each of its stages in order (the
// step staged by it, bitwise the unstaged step), EndStep after; a skipped step is begun and ended.
TEST_F(OptimizersTest, StepSyncIsToldEveryStepSkippedOrNot) {
  std::vector<Param> whole_params = ToyParams(), synced_params = ToyParams();
  auto whole = ChainedOptimizer::Create(whole_params, ChainedConfig{});
  std::vector<std::string> log;
  const std::map<std::string, int> stage_of = {{"embed.weight", 2},
                                               {"layers.0.norm.weight", 1},
                                               {"layers.0.fc1.weight", 1},
                                               {"layers.0.fc2.weight", 0},
                                               {"layers.0.fc2.bias", 0}};
  auto synced =
      WithSync(synced_params, std::make_unique<LoggingStepSync>(&log, stage_of, /*n=*/3));
  ASSERT_TRUE(whole.ok() && synced.ok()) << synced.status();
  ASSERT_OK((*whole)->Step().status());
  ASSERT_OK((*synced)->Step().status());
  EXPECT_EQ(log, (std::vector<std::string>{"begin", "stage 0", "stage 1", "stage 2", "end"}));
  for (size_t i = 0; i < whole_params.size(); ++i) {
    EXPECT_TRUE(at::equal(whole_params[i].param, synced_params[i].param)) << whole_params[i].name;
  }
  log.clear();
  synced_params[1].grad.fill_(std::nan(""));
  ASSERT_OK_AND_ASSIGN(const StepResult skipped, (*synced)->Step());
  EXPECT_TRUE(skipped.skipped);
  EXPECT_EQ(log, (std::vector<std::string>{"begin", "end"}));
}

TEST_F(OptimizersTest, ImportErrors) {
  auto adamw = AdamW::Create({{Slot::Whole("w", Det({4, 4}, 0.0), at::Tensor()), AdamWHyper{}}});
  ASSERT_TRUE(adamw.ok());
  const std::vector<StateRecord> state = Export(**adamw);
  ASSERT_EQ(state[0].name, "w/exp_avg");
  std::vector<StateRecord> missing(state.begin() + 1, state.end());
  EXPECT_THAT((*adamw)->ImportState(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing state tensor 'w/exp_avg'")));
  std::vector<StateRecord> bad_shape = state;
  bad_shape[0].full_shape = {2, 8};
  EXPECT_THAT((*adamw)->ImportState(bad_shape),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("state tensor 'w/exp_avg': expected shape [4,4], received "
                                 "[2,8]")));
  std::vector<StateRecord> short_piece = state;
  short_piece[0].tensor = at::zeros({10}, at::kFloat);
  EXPECT_THAT((*adamw)->ImportState(short_piece),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("state tensor 'w/exp_avg' covers 10 of 16 elements")));
  std::vector<StateRecord> outside = state;
  outside[0].offset = 8;
  EXPECT_THAT((*adamw)->ImportState(outside),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("state tensor 'w/exp_avg': piece [8, 24) outside 16 elements")));
  std::vector<StateRecord> bad_dtype = state;
  bad_dtype[2].tensor = at::full({}, 1.0, at::kFloat);
  EXPECT_THAT((*adamw)->ImportState(bad_dtype),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("state tensor 'w/step': expected an int64 scalar, received "
                                 "Float")));
}

TEST_F(OptimizersTest, ChainedImportIsAllOrNothing) {
  auto a = ChainedOptimizer::Create(ToyParams(), ChainedConfig{});
  auto b = ChainedOptimizer::Create(ToyParams(), ChainedConfig{});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*a)->Step().ok());
  std::vector<StateRecord> saved = (*a)->ExportState();
  std::vector<StateRecord> partial;
  for (const StateRecord& t : saved) {
    if (t.name != "layers.0.fc2.weight/momentum_buffer") partial.push_back(t);
  }
  const std::vector<StateRecord> b_before = (*b)->ExportState();
  EXPECT_THAT((*b)->ImportState(partial),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("missing state tensor 'layers.0.fc2.weight/momentum_buffer'")));
  EXPECT_TRUE(StatesEqual((*b)->ExportState(), b_before));
  // Records of params the model does not have, or fields their optimizer does not keep.
  for (const char* name : {"sgd/w/momentum", "embed.weight/momentum_buffer",
                           "layers.0.fc1.weight/exp_avg", "chained"}) {
    partial = saved;
    partial.push_back({name, {1}, 0, at::zeros({1}, at::kFloat)});
    EXPECT_THAT((*b)->ImportState(partial),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("unexpected state tensor '", name, "'"))));
    EXPECT_TRUE(StatesEqual((*b)->ExportState(), b_before)) << name;
  }
}

// SetRowScales: the rows of a Muon param and of an AdamW param are scaled right after their update
// (bitwise the update followed by the same multiply), in the per-slot and the batched Newton-Schulz
// paths; a bf16 model param gets the scaled main param rounded; the scales are consumed by the
// step, and dropped by a skipped one.
TEST_F(OptimizersTest, RowScalesApplyAfterTheUpdate) {
  for (const bool batched : {false, true}) {
    ChainedConfig config;
    config.muon.ns.batched = batched;
    std::vector<Param> a_params = ToyParams(), b_params = ToyParams();
    a_params[3].param = a_params[3].param.to(at::kBFloat16);  // fc2: bf16 with a main param
    b_params[3].param = b_params[3].param.to(at::kBFloat16);
    auto a = ChainedOptimizer::Create(a_params, config);
    auto b = ChainedOptimizer::Create(b_params, config);
    ASSERT_TRUE(a.ok() && b.ok());
    const at::Tensor embed_scales = Det({20}, 0.7).abs_();
    const at::Tensor fc1_scales = Det({16}, 0.8).abs_();
    const at::Tensor fc2_scales = Det({8}, 0.9).abs_();
    ASSERT_OK((*a)->SetRowScales("embed.weight", embed_scales));
    ASSERT_OK((*a)->SetRowScales("layers.0.fc1.weight", fc1_scales));
    ASSERT_OK((*a)->SetRowScales("layers.0.fc2.weight", fc2_scales));
    ASSERT_TRUE((*a)->Step().ok());
    ASSERT_TRUE((*b)->Step().ok());
    b_params[0].param.mul_(embed_scales.view({-1, 1}));
    b_params[2].param.mul_(fc1_scales.view({-1, 1}));
    EXPECT_TRUE(at::equal(a_params[0].param, b_params[0].param)) << batched;
    EXPECT_TRUE(at::equal(a_params[2].param, b_params[2].param)) << batched;
    EXPECT_TRUE(at::equal(a_params[1].param, b_params[1].param)) << batched;
    const at::Tensor a_main = Record((*a)->ExportState(), "layers.0.fc2.weight/main_param");
    const at::Tensor b_main = Record((*b)->ExportState(), "layers.0.fc2.weight/main_param");
    EXPECT_TRUE(at::equal(a_main, b_main.mul(fc2_scales.view({-1, 1})))) << batched;
    EXPECT_TRUE(at::equal(a_params[3].param, a_main.to(at::kBFloat16))) << batched;
    // Consumed: the next step scales nothing (the fp32 params and every state still agree).
    ASSERT_TRUE((*a)->Step().ok());
    ASSERT_TRUE((*b)->Step().ok());
    EXPECT_TRUE(at::equal(a_params[0].param, b_params[0].param)) << batched;
    EXPECT_TRUE(at::equal(a_params[2].param, b_params[2].param)) << batched;
  }
  // A skipped step scales nothing and drops the scales.
  std::vector<Param> params = ToyParams();
  auto c = ChainedOptimizer::Create(params, ChainedConfig{});
  ASSERT_TRUE(c.ok());
  const at::Tensor kept = params[2].param.clone();
  ASSERT_OK((*c)->SetRowScales("layers.0.fc1.weight", at::full({16}, 0.5)));
  params[2].grad[0][0] = NAN;
  ASSERT_OK_AND_ASSIGN(const StepResult skipped, (*c)->Step());
  EXPECT_TRUE(skipped.skipped);
  EXPECT_TRUE(at::equal(params[2].param, kept));
  // Errors name the param.
  EXPECT_THAT((*c)->SetRowScales("nope", at::ones({3})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row scales for param 'nope', which the routing does not list")));
  EXPECT_THAT((*c)->SetRowScales("layers.0.fc1.weight", at::ones({3})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'layers.0.fc1.weight' of shape [16,8]: row scales of "
                                 "shape [3], expected one per row of a 2-D param")));
  EXPECT_THAT((*c)->SetRowScales("layers.0.norm.weight", at::ones({8})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("of shape [8]: row scales")));
}

// Row scales of a param held in parts (ZeRO-1 element ranges that start and end inside rows) scale
// each part's elements by their row's factor: bitwise the whole param's scaled update.
TEST_F(OptimizersTest, RowScalesOfAdamWPartsMatchTheWhole) {
  const at::Tensor init = Det({6, 5}, 0.4);
  const at::Tensor grad = Det({6, 5}, 1.4, 0.1);
  const at::Tensor scales = Det({6}, 0.6).abs_();
  at::Tensor whole = init.clone();
  auto whole_opt = AdamW::Create({{Slot::Whole("w", whole, grad), AdamWHyper{}}});
  ASSERT_TRUE(whole_opt.ok());
  at::Tensor parted = init.clone();
  std::vector<AdamW::Entry> parts;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 7}, {7, 19}, {19, 30}};
  for (const auto& [lo, hi] : ranges) {
    Slot s;
    s.name = "w" + std::to_string(lo);
    s.full_shape = {6, 5};
    s.offset = lo;
    s.param = parted.view({-1}).narrow(0, lo, hi - lo);
    s.grad = grad.view({-1}).narrow(0, lo, hi - lo);
    s.saved_end = hi - lo;
    parts.push_back({s, AdamWHyper{}});
  }
  auto parts_opt = AdamW::Create(std::move(parts));
  ASSERT_TRUE(parts_opt.ok()) << parts_opt.status();
  for (int step = 0; step < 2; ++step) {
    ASSERT_OK_AND_ASSIGN(const bool held, (*whole_opt)->SetRowScales("w", scales));
    EXPECT_TRUE(held);
    for (const auto& [lo, hi] : ranges) {
      ASSERT_OK((*parts_opt)->SetRowScales("w" + std::to_string(lo), scales).status());
    }
    ASSERT_TRUE((*whole_opt)->Step({0.5, 1.0}).ok());
    ASSERT_TRUE((*parts_opt)->Step({0.5, 1.0}).ok());
    EXPECT_TRUE(at::equal(parted, whole)) << step;
  }
  ASSERT_OK_AND_ASSIGN(const bool held, (*whole_opt)->SetRowScales("other", scales));
  EXPECT_FALSE(held);
}

// The same params split into parts (as ZeRO-1 ranks hold them) step bitwise as the whole; the
// parts' exports together are the whole's; a replicated rank saves only its share of a whole slot.
TEST_F(OptimizersTest, AdamWPartsStepAndSaveAsTheWhole) {
  const at::Tensor init = Det({6, 5}, 0.4);
  const at::Tensor grad = Det({6, 5}, 1.4, 0.1);
  at::Tensor whole = init.clone();
  auto whole_opt = AdamW::Create({{Slot::Whole("w", whole, grad), AdamWHyper{}}});
  ASSERT_TRUE(whole_opt.ok());
  at::Tensor parted = init.clone();
  std::vector<AdamW::Entry> parts;
  for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, 7}, {7, 19}, {19, 30}}) {
    Slot s;
    s.name = "w" + std::to_string(lo);  // one optimizer holds each part under its own name here
    s.full_shape = {6, 5};
    s.offset = lo;
    s.param = parted.view({-1}).narrow(0, lo, hi - lo);
    s.grad = grad.view({-1}).narrow(0, lo, hi - lo);
    s.saved_end = hi - lo;
    parts.push_back({s, AdamWHyper{}});
  }
  auto parts_opt = AdamW::Create(std::move(parts));
  ASSERT_TRUE(parts_opt.ok()) << parts_opt.status();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*whole_opt)->Step({0.5, 0.25}).ok());
    ASSERT_TRUE((*parts_opt)->Step({0.5, 0.25}).ok());
  }
  EXPECT_TRUE(at::equal(parted, whole));
  // Renamed back, the parts' records assemble into the whole's state.
  std::vector<StateRecord> pieces = Export(**parts_opt);
  for (StateRecord& r : pieces) r.name = "w" + r.name.substr(r.name.find('/'));
  ASSERT_OK_AND_ASSIGN(std::vector<StateRecord> assembled, AssembleModelSpace(pieces));
  ASSERT_OK_AND_ASSIGN(std::vector<StateRecord> reference, AssembleModelSpace(Export(**whole_opt)));
  EXPECT_TRUE(StatesEqual(assembled, reference));

  // A whole slot that saves [4, 11) only: its records are that range, at offset 4, and the step.
  Slot share = Slot::Whole("w", whole, grad);
  share.saved_begin = 4;
  share.saved_end = 11;
  auto share_opt = AdamW::Create({{share, AdamWHyper{}}});
  ASSERT_TRUE(share_opt.ok());
  for (const StateRecord& r : Export(**share_opt)) {
    if (r.name == "w/step") continue;
    EXPECT_EQ(r.offset, 4) << r.name;
    EXPECT_EQ(r.tensor.numel(), 7) << r.name;
    EXPECT_EQ(r.full_shape, (std::vector<int64_t>{6, 5})) << r.name;
  }
  // Nothing saved: no records at all, the step counter included.
  share.saved_begin = share.saved_end = 0;
  auto silent = AdamW::Create({{share, AdamWHyper{}}});
  ASSERT_TRUE(silent.ok());
  EXPECT_TRUE(Export(**silent).empty());
}

// A StatsReducer's global statistics, not the local ones, decide clipping and skipping.
TEST_F(OptimizersTest, ReducerDecidesFromGlobalStatistics) {
  class OtherRankNonFinite : public StatsReducer {
   public:
    explicit OtherRankNonFinite(int* calls) : calls_(calls) {}
    absl::StatusOr<GradStats> Reduce(const GradStats& local) override {
      ++*calls_;
      GradStats global = local;
      global.adamw_sum_squares += 100.0;  // another rank's share
      global.nonfinite = *calls_ == 2;     // another rank overflows at the second step
      return global;
    }

   private:
    int* calls_;
  };
  int calls = 0;
  std::vector<Param> params = ToyParams();
  std::vector<Slot> slots;
  std::vector<ParamDescriptor> descriptors;
  for (const Param& p : params) {
    slots.push_back(Slot::Whole(p.name, p.param, p.grad));
    descriptors.push_back({p.name, p.param.sizes().vec()});
  }
  ChainedConfig config;
  config.max_grad_norm = 1.0;
  ASSERT_OK_AND_ASSIGN(RoutingReport routing, PlanRouting(config.routing, descriptors));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChainedOptimizer> opt,
      ChainedOptimizer::Create(config, routing, slots, {},
                               std::make_unique<OtherRankNonFinite>(&calls)));
  ASSERT_OK_AND_ASSIGN(const GradStats local, opt->LocalGradStats());
  ASSERT_OK_AND_ASSIGN(StepResult first, opt->Step());
  EXPECT_FALSE(first.skipped);
  EXPECT_EQ(first.stats.adamw_sum_squares, local.adamw_sum_squares + 100.0);
  EXPECT_EQ(first.grad_norm, std::sqrt(local.adamw_sum_squares + 100.0 + local.muon_sum_squares));
  EXPECT_LT(first.clip_scale, 0.1);  // clipped by the global norm (> 10), not the local one
  ASSERT_OK_AND_ASSIGN(StepResult second, opt->Step());
  EXPECT_TRUE(second.skipped);  // every local gradient is finite
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(opt->steps_taken(), 1);
  EXPECT_EQ(opt->skipped_steps(), 1);
}

TEST_F(OptimizersTest, ChainedCreateErrors) {
  std::vector<ParamDescriptor> descriptors = {{"w", {4, 4}}};
  ASSERT_OK_AND_ASSIGN(RoutingReport routing, PlanRouting(RoutingConfig{}, descriptors));
  EXPECT_THAT(ChainedOptimizer::Create({}, routing, {Slot::Whole("v", Det({4, 4}, 0.0), {})}, {},
                                       nullptr)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("slot of param 'v', which the routing does not list")));
  EXPECT_THAT(ChainedOptimizer::Create({}, routing, {}, {{"x", FusedSplit{1, {2, 2}}}}, nullptr)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fused split given for unknown param 'x'")));
  // A part of a Muon-routed matrix.
  Slot part;
  part.name = "w";
  part.full_shape = {4, 4};
  part.offset = 8;
  part.param = Det({8}, 0.0);
  part.saved_end = 8;
  EXPECT_THAT(ChainedOptimizer::Create({}, routing, {part}, {}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'w': Muon needs the whole matrix, got a part of 8 "
                                 "elements at offset 8 of [4,4]")));
  part.offset = 12;
  EXPECT_THAT(AdamW::Create({{part, AdamWHyper{}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'w': a part of shape [8] at offset 12 does not fit the "
                                 "whole param [4,4]")));
  part.offset = 0;
  part.saved_end = 9;
  EXPECT_THAT(AdamW::Create({{part, AdamWHyper{}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'w': saved range [0, 9) outside its 8 elements")));
}

TEST_F(OptimizersTest, ParamWithoutGradIsNotStepped) {
  at::Tensor w = Det({4, 4}, 0.0), v = Det({4, 4}, 1.0);
  const at::Tensor w0 = w.clone(), v0 = v.clone();
  auto muon = Muon::Create({{Slot::Whole("w", w, at::Tensor()), MuonHyper{}, {}},
                            {Slot::Whole("v", v, Det({4, 4}, 2.0)), MuonHyper{}, {}}});
  ASSERT_TRUE(muon.ok());
  ASSERT_TRUE((*muon)->Step({}).ok());
  EXPECT_TRUE(at::equal(w, w0));
  EXPECT_FALSE(at::equal(v, v0));
}

TEST_F(OptimizersTest, CreateErrors) {
  EXPECT_THAT(Muon::Create({{Slot::Whole("b", Det({4}, 0.0), {}), MuonHyper{}, {}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'b': Muon needs a 2-D matrix, got shape [4]")));
  EXPECT_THAT(
      Muon::Create({{Slot::Whole("qkv", Det({80, 8}, 0.0), {}), MuonHyper{}, {2, {32, 8, 8}}}})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("param 'qkv': fused split 2 groups x 48 rows = 96 rows, weight has 80")));
  MuonHyper bad_muon;
  bad_muon.ns.ns_steps = 0;
  EXPECT_THAT(Muon::Create({{Slot::Whole("w", Det({4, 4}, 0.0), {}), bad_muon, {}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Muon: ns_steps must be in [1, 100), got 0")));
  AdamWHyper bad_adamw;
  bad_adamw.beta1 = 1.0;
  EXPECT_THAT(AdamW::Create({{Slot::Whole("w", Det({4}, 0.0), {}), bad_adamw}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("AdamW: beta1 must be in [0, 1), got 1")));
  EXPECT_THAT(AdamW::Create({{Slot::Whole("i", at::zeros({3}, at::kLong), {}), AdamWHyper{}}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("param 'i': dtype Long, expected Float or BFloat16")));
  EXPECT_THAT(AdamW::Create({{Slot::Whole("w", Det({2}, 0.0), {}), AdamWHyper{}},
                             {Slot::Whole("w", Det({2}, 0.0), {}), AdamWHyper{}}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate param name 'w'")));
  EXPECT_THAT(
      AdamW::Create({{Slot::Whole("w", Det({4, 4}, 0.0), Det({3, 3}, 1.0)), AdamWHyper{}}})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("param 'w': grad shape [3,3], expected [4,4]")));
}

TEST(StateRecordTest, AssembleReportsGapsAndMismatches) {
  std::vector<StateRecord> pieces = {
      {"w/exp_avg", {2, 4}, 0, at::zeros({5}, at::kFloat)},
      {"w/exp_avg", {2, 4}, 5, at::zeros({3}, at::kFloat)},
  };
  ASSERT_OK_AND_ASSIGN(std::vector<StateRecord> whole, AssembleModelSpace(pieces));
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].tensor.sizes(), (std::vector<int64_t>{2, 4}));
  pieces[1].offset = 4;
  EXPECT_THAT(AssembleModelSpace(pieces).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("state tensor 'w/exp_avg' covers 7 of 8 elements")));
  pieces[1].offset = 6;
  EXPECT_THAT(AssembleModelSpace(pieces).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("piece [6, 9) outside 8")));
  pieces[1].offset = 5;
  pieces[1].full_shape = {8};
  EXPECT_THAT(AssembleModelSpace(pieces).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected shape [2,4], received [8]")));
}

}  // namespace
}  // namespace orthoshard::optimizers
