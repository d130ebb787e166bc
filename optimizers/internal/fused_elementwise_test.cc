#include "optimizers/internal/fused_elementwise.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/div.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "gtest/gtest.h"
#include "optimizers/adamw.h"
#include "optimizers/muon.h"

namespace orthoshard::optimizers::internal {
namespace {

// Bit patterns, so that -0 vs +0 and NaN payloads count as differences.
bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  const at::ScalarType bits = a.element_size() == 4 ? at::kInt : at::kShort;
  return at::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}

// Gaussian values spread over many binades, with zeros, negative zeros and fp32 subnormals mixed
// in.
at::Tensor AwkwardValues(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor t = at::randn({n}).mul_(at::exp2(at::randn({n}).mul_(8.0)));
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < n; i += 97) p[i] = 0.0f;
  for (int64_t i = 13; i < n; i += 89) p[i] = -0.0f;
  for (int64_t i = 29; i < n; i += 101) p[i] = std::numeric_limits<float>::denorm_min() * (i % 7);
  for (int64_t i = 41; i < n; i += 103) p[i] = -1e-39f;  // subnormal
  return t;
}

// The cores this process may run on: its CPU affinity set, and never more than
// std::thread::hardware_concurrency(). No case runs more intra-op threads than this: ATen's OpenMP
// threads spin at every parallel region's barrier, so threads beyond the cores (or a second thread
// on a busy 2-core machine) wait out scheduler time slices at each of the thousands of calls here.
int AvailableCores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::min(cores, CPU_COUNT(&set));
  return std::max(cores, 1);
}

// The tests that do not choose a thread count run with ATen's default capped at the cores.
class CapThreadsAtCores : public ::testing::Environment {
 public:
  void SetUp() override { at::set_num_threads(std::min(at::get_num_threads(), AvailableCores())); }
};
::testing::Environment* const kCapThreads =
    ::testing::AddGlobalTestEnvironment(new CapThreadsAtCores);

// Parameter: the intra-op thread count of the kernel under test. Two threads prove that splitting
// a tensor into chunks (sizes above the kernels' grain of 32768) gives the bits of one pass; the
// case is skipped where fewer cores are available, rather than oversubscribing them. Inputs and
// references are computed on one thread (ATen's elementwise ops give the same bits at any thread
// count), so only the kernel under test pays for parallel regions: on a busy machine each region
// waits for a descheduled thread, which made the 2-thread AdamW case 30x slower than 1 thread.
class MuonElementwiseTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();  // TearDown restores it, also after a skip
    if (!AtenKernelsUseFma()) {
      GTEST_SKIP() << "ATen's kernels here do not use fma: MuonUpdate keeps ATen's ops";
    }
    if (GetParam() > AvailableCores()) {
      GTEST_SKIP() << GetParam() << " threads on " << AvailableCores()
                   << " available core(s) would oversubscribe them";
    }
    at::set_num_threads(1);
  }
  void TearDown() override { at::set_num_threads(threads_); }

  // Runs `kernel` on GetParam() intra-op threads, then returns to one.
  template <typename Kernel>
  void Threaded(Kernel kernel) {
    at::set_num_threads(GetParam());
    kernel();
    at::set_num_threads(1);
  }

 private:
  int threads_ = 1;
};

TEST_P(MuonElementwiseTest, MomentumMatchesAtenBitwise) {
  uint64_t seed = 1;
  for (int64_t n : {1, 7, 16, 33, 1000, 32769, 70001}) {
    for (double mu : {0.95, 0.9, 0.5, 0.3, 1e-3}) {
      for (bool nesterov : {true, false}) {
        for (at::ScalarType out : {at::kBFloat16, at::kFloat}) {
          const std::string where = "n=" + std::to_string(n) + " mu=" + std::to_string(mu) +
                                    " nesterov=" + std::to_string(nesterov) +
                                    " out=" + std::string(c10::toString(out));
          const at::Tensor grad = AwkwardValues(n, seed++);
          const at::Tensor momentum = AwkwardValues(n, seed++);
          const at::Tensor ref_m = momentum.clone();
          ref_m.lerp_(grad, 1.0 - mu);
          const at::Tensor ref_u =
              (nesterov ? at::lerp(grad, ref_m, mu) : ref_m).to(out, false, /*copy=*/true);

          ASSERT_TRUE(CanFuseMomentum(momentum, grad, mu)) << where;
          at::Tensor u;
          Threaded([&] { u = FusedMomentum(momentum, grad, mu, nesterov, out); });
          EXPECT_TRUE(SameBits(momentum, ref_m)) << where;
          EXPECT_TRUE(SameBits(u, ref_u)) << where;
        }
      }
    }
  }
}

TEST_P(MuonElementwiseTest, DecayAddMatchesAtenBitwise) {
  uint64_t seed = 100;
  for (int64_t n : {1, 7, 33, 1000, 32769, 70001}) {
    for (at::ScalarType type : {at::kBFloat16, at::kFloat}) {
      for (double decay : {1.0, 1.0 - 0.02 * 0.1, 0.75}) {
        for (double alpha : {-0.02, -0.02 * std::sqrt(3.0), 1.5}) {
          const std::string where = "n=" + std::to_string(n) + " decay=" + std::to_string(decay) +
                                    " alpha=" + std::to_string(alpha) +
                                    " type=" + std::string(c10::toString(type));
          const at::Tensor param = AwkwardValues(n, seed++);
          const at::Tensor update = AwkwardValues(n, seed++).to(type);
          const at::Tensor ref = param.clone();
          ref.mul_(decay);
          ref.add_(update, alpha);

          ASSERT_TRUE(CanFuseDecayAdd(param, update)) << where;
          Threaded([&] { FusedDecayAdd(param, decay, update, alpha); });
          EXPECT_TRUE(SameBits(param, ref)) << where;
        }
      }
    }
  }
}

// AdamW's ATen op sequence (torch/optim/adam.py `_single_tensor_adam`, decoupled weight decay), as
// AdamWUpdate runs it when it cannot fuse.
void AdamWReference(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m,
                    const at::Tensor& v, const AdamWScalars& s) {
  if (s.apply_decay) p.mul_(s.decay);
  m.lerp_(g, 1.0 - s.beta1);
  v.mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
  const at::Tensor denom = at::div(v.sqrt(), s.bias_correction2_sqrt).add_(s.eps);
  p.addcdiv_(m, denom, -s.step_size);
}

TEST_P(MuonElementwiseTest, AdamWMatchesAtenBitwise) {
  uint64_t seed = 300;
  // 140001: several blocks per thread (FusedAdamW works in blocks of 65536).
  for (int64_t n : {1, 7, 33, 1000, 32769, 70001, 140001}) {
    for (double beta1 : {0.9, 0.5, 0.3}) {
      for (double beta2 : {0.999, 0.95}) {
        for (double wd : {0.0, 0.1}) {
          for (int64_t step : {1, 10}) {
            for (double eps : {1e-8, 0.0}) {
              const double lr = 3e-3;
              AdamWScalars s;
              s.apply_decay = wd != 0.0;
              s.decay = 1.0 - lr * wd;
              s.beta1 = beta1;
              s.beta2 = beta2;
              s.bias_correction2_sqrt = std::pow(1.0 - std::pow(beta2, step), 0.5);
              s.eps = eps;
              s.step_size = lr / (1.0 - std::pow(beta1, step));
              const std::string where =
                  "n=" + std::to_string(n) + " beta1=" + std::to_string(beta1) +
                  " beta2=" + std::to_string(beta2) + " wd=" + std::to_string(wd) +
                  " step=" + std::to_string(step) + " eps=" + std::to_string(eps);
              const at::Tensor p = AwkwardValues(n, seed++);
              const at::Tensor g = AwkwardValues(n, seed++);
              const at::Tensor m = AwkwardValues(n, seed++).mul_(1e-2);
              // A second moment is >= 0; with eps 0 a zero one divides by zero (inf or NaN,
              // whose payload is not compared: SameBits would count it), so keep it positive.
              const at::Tensor v = AwkwardValues(n, seed++).abs_().add_(eps == 0.0 ? 1e-30 : 0.0);
              const at::Tensor rp = p.clone(), rm = m.clone(), rv = v.clone();
              AdamWReference(rp, g, rm, rv, s);
              ASSERT_TRUE(CanFuseAdamW(p, g, m, v, beta1)) << where;
              Threaded([&] { FusedAdamW(p, g, m, v, s); });
              EXPECT_TRUE(SameBits(m, rm)) << where;
              EXPECT_TRUE(SameBits(v, rv)) << where;
              EXPECT_TRUE(SameBits(p, rp)) << where;
            }
          }
        }
      }
    }
  }
}

// AdamWUpdate on a tensor large enough to take the fused path, several steps, against the ATen
// op sequence (a 1-D contiguous view, as the ZeRO-1 optimizer passes its shards).
// On a CPU whose ATen kernels do not use fma, AdamWUpdate keeps ATen's ops: the same comparison
// then checks that path.
TEST(AdamWUpdateFusedTest, MatchesAtenOpSequenceBitwise) {
  const int64_t n = kFusedAdamWMinNumel + 12345;
  at::manual_seed(7);
  const at::Tensor whole = at::randn({n + 100});
  const at::Tensor param = whole.narrow(0, 50, n);
  const at::Tensor ref_param = param.clone();
  AdamWState state = MakeAdamWState(param);
  AdamWState ref = MakeAdamWState(param);
  AdamWHyper hp;
  hp.weight_decay = 0.1;
  for (int step = 1; step <= 3; ++step) {
    const at::Tensor grad = at::randn({n}).mul_(0.1);
    const double lr = 1e-2 * step;
    AdamWUpdate(param, grad, state, hp, lr);
    AdamWScalars s;
    s.apply_decay = true;
    s.decay = 1.0 - lr * hp.weight_decay;
    s.beta1 = hp.beta1;
    s.beta2 = hp.beta2;
    s.bias_correction2_sqrt = std::pow(1.0 - std::pow(hp.beta2, step), 0.5);
    s.eps = hp.eps;
    s.step_size = lr / (1.0 - std::pow(hp.beta1, step));
    AdamWReference(ref_param, grad, ref.exp_avg, ref.exp_avg_sq, s);
  }
  EXPECT_EQ(state.step, 3);
  EXPECT_TRUE(SameBits(state.exp_avg, ref.exp_avg));
  EXPECT_TRUE(SameBits(state.exp_avg_sq, ref.exp_avg_sq));
  EXPECT_TRUE(SameBits(param, ref_param));
}

INSTANTIATE_TEST_SUITE_P(Threads, MuonElementwiseTest, ::testing::Values(1, 2));

TEST(MuonElementwiseEligibilityTest, RejectsWhatItCannotFuse) {
  const at::Tensor m = at::zeros({8, 6});
  if (!AtenKernelsUseFma()) {
    // ATen's own kernels would round differently from a fused fma pass: nothing may be fused.
    EXPECT_FALSE(CanFuseMomentum(m, at::randn({8, 6}), 0.95));
    EXPECT_FALSE(CanFuseDecayAdd(m, at::randn({8, 6}, at::kBFloat16)));
    EXPECT_FALSE(CanFuseAdamW(at::randn({8, 6}), at::randn({8, 6}), m, at::zeros({8, 6}), 0.9));
    return;
  }
  EXPECT_TRUE(CanFuseMomentum(m, at::randn({8, 6}), 0.95));
  EXPECT_FALSE(CanFuseMomentum(m, at::randn({8, 6}), 0.0));                // weight 1 (see header)
  EXPECT_FALSE(CanFuseMomentum(m, at::randn({6, 8}).t(), 0.95));           // strided
  EXPECT_FALSE(CanFuseMomentum(m, at::randn({8, 6}, at::kDouble), 0.95));  // dtype
  EXPECT_FALSE(CanFuseMomentum(m, at::randn({8, 5}), 0.95));               // numel
  EXPECT_FALSE(CanFuseMomentum(m, m, 0.95));                                // aliasing
  EXPECT_TRUE(CanFuseDecayAdd(m, at::randn({8, 6}, at::kBFloat16)));
  EXPECT_FALSE(CanFuseDecayAdd(m, at::randn({6, 8}, at::kBFloat16).t()));
  EXPECT_FALSE(CanFuseDecayAdd(m, at::randn({8, 6}, at::kHalf)));
  const at::Tensor p = at::randn({8, 6}), g = at::randn({8, 6}), v = at::zeros({8, 6});
  EXPECT_TRUE(CanFuseAdamW(p, g, m, v, 0.9));
  EXPECT_FALSE(CanFuseAdamW(p, g, m, v, 0.0));                      // lerp weight 1
  EXPECT_FALSE(CanFuseAdamW(p, g, m, m, 0.9));                      // aliasing moments
  EXPECT_FALSE(CanFuseAdamW(p, at::randn({6, 8}).t(), m, v, 0.9));  // strided grad
  EXPECT_FALSE(CanFuseAdamW(p.to(at::kDouble), g, m, v, 0.9));      // dtype
}

// The whole step: MuonUpdate (fused where it can) against torch/optim/_muon.py's op sequence
// written with ATen ops, for wide, tall (transposed NS, ATen add path) and square matrices.
TEST(MuonUpdateFusedTest, MatchesAtenOpSequenceBitwise) {
  uint64_t seed = 500;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{48, 200}, {200, 48}, {64, 64}}) {
    for (bool nesterov : {true, false}) {
      for (NsDType dtype : {NsDType::kBFloat16, NsDType::kFloat32}) {
        MuonHyper hp;
        hp.momentum = rows == 64 && !nesterov ? 0.0 : 0.95;  // mu = 0 takes the ATen path
        hp.nesterov = nesterov;
        hp.ns.dtype = dtype;
        hp.weight_decay = 0.1;
        const double lr = 0.02;
        at::manual_seed(seed++);
        const at::Tensor param = at::randn({rows, cols});
        const at::Tensor ref_param = param.clone();
        const at::Tensor momentum = at::zeros_like(param);
        const at::Tensor ref_momentum = momentum.clone();
        for (int step = 0; step < 3; ++step) {
          const at::Tensor grad = at::randn({rows, cols}).mul_(0.1);
          MuonUpdate(param, grad, momentum, hp, lr, FusedSplit{});

          ref_momentum.lerp_(grad, 1.0 - hp.momentum);
          const at::Tensor u = nesterov ? at::lerp(grad, ref_momentum, hp.momentum) : ref_momentum;
          const at::Tensor o = NewtonSchulz(u, hp.ns);
          ref_param.mul_(1.0 - lr * hp.weight_decay);
          ref_param.add_(o, -lr * MuonLrScale(rows, cols, hp));
        }
        const std::string where = std::to_string(rows) + "x" + std::to_string(cols) +
                                  " nesterov=" + std::to_string(nesterov) +
                                  " bf16=" + std::to_string(dtype == NsDType::kBFloat16);
        EXPECT_TRUE(SameBits(momentum, ref_momentum)) << where;
        EXPECT_TRUE(SameBits(param, ref_param)) << where;
      }
    }
  }
}

}  // namespace
}  // namespace orthoshard::optimizers::internal
