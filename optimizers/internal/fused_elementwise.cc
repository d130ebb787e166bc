#include "optimizers/internal/fused_elementwise.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sqrt.h>
#include <c10/util/Exception.h>
#include <c10/util/BFloat16.h>

namespace orthoshard::optimizers::internal {
namespace {

// Elements per parallel chunk: large enough that a chunk amortises the thread hand-off, small
// enough that both cores get work on tensors of a few MB (ATen's own grain is 32768).
constexpr int64_t kGrain = 32768;

// Elements per AdamW block: param, grad, both moments and the square roots of a block (1.25 MB)
// stay in a core's L2 between the passes over it.
constexpr int64_t kAdamWBlock = 65536;

#define OS_INLINE inline __attribute__((always_inline))

OS_INLINE float Fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// ATen's vectorised lerp: fma(w, end - start, start) when |w| < 0.5, else fma(w - 1, end - start,
// end). `coeff` is w or w - 1 (computed once, in float, as ATen does).
template <bool kSmall>
OS_INLINE float Lerp(float start, float end, float coeff) {
  return Fma(coeff, end - start, kSmall ? start : end);
}

// c10's round-to-nearest-even fp32 -> bf16; NaN becomes 0xFFFF as in ATen's vectorised cast.
OS_INLINE uint16_t ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0xFFFF} : static_cast<uint16_t>(rounded);
}

OS_INLINE float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

OS_INLINE void Store(float* out, int64_t i, float v) { out[i] = v; }
OS_INLINE void Store(uint16_t* out, int64_t i, float v) { out[i] = ToBf16Bits(v); }
OS_INLINE float Load(const float* in, int64_t i) { return in[i]; }
OS_INLINE float Load(const uint16_t* in, int64_t i) { return FromBf16Bits(in[i]); }

template <bool kSmall1, bool kSmall2, bool kNesterov, typename Out>
OS_INLINE void MomentumLoop(float* __restrict m, const float* __restrict g, Out* __restrict out,
                            float c1, float c2, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i];
    const float mi = Lerp<kSmall1>(m[i], gi, c1);  // momentum.lerp_(grad, 1 - mu)
    m[i] = mi;
    Store(out, i, kNesterov ? Lerp<kSmall2>(gi, mi, c2) : mi);  // lerp(grad, momentum, mu)
  }
}

template <typename Update>
OS_INLINE void DecayAddLoop(float* __restrict p, const Update* __restrict u, float decay,
                            float alpha, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) p[i] = Fma(Load(u, i), alpha, p[i] * decay);
}

// AdamW's ATen ops up to the square root, with the same roundings: mul_(decay) (when weight decay is
// on), lerp_, then mul_(beta2) and addcmul_ (ATen's `self + value * t1 * t2` compiles to
// fma(value * t1, t2, self)).
struct AdamWConstants {
  float decay, lerp_coeff, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size;
};

template <bool kSmall, bool kDecay>
OS_INLINE void AdamWMomentsLoop(float* __restrict p, const float* __restrict g,
                                float* __restrict m, float* __restrict v, const AdamWConstants& k,
                                int64_t begin, int64_t end) {
  // Constants in locals: stores through p, m and v could otherwise alias `k`, which keeps the
  // compiler from vectorising.
  const float decay = k.decay, coeff = k.lerp_coeff, beta2 = k.beta2, c = k.one_minus_beta2;
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i];
    if (kDecay) p[i] = p[i] * decay;
    m[i] = Lerp<kSmall>(m[i], gi, coeff);
    v[i] = Fma(c * gi, gi, v[i] * beta2);
  }
}

// After ATen's sqrt: / bias_correction2_sqrt, + eps, then addcdiv_'s self + (value * t1) / t2.
OS_INLINE void AdamWApplyLoop(float* __restrict p, const float* __restrict m,
                              const float* __restrict sqrt_v, const AdamWConstants& k,
                              int64_t begin, int64_t end) {
  const float bc2_sqrt = k.bc2_sqrt, eps = k.eps, neg_step_size = k.neg_step_size;
  for (int64_t i = begin; i < end; ++i) {
    const float denom = sqrt_v[i] / bc2_sqrt + eps;
    p[i] = p[i] + (neg_step_size * m[i]) / denom;
  }
}

// The loops compiled for AVX2 + FMA (vectorised, hardware fma), whatever the build's baseline ISA.
// Only used where ATen's own kernels use fma too (AtenKernelsUseFma): its generic build, which
// runs on an older CPU or when ATEN_CPU_CAPABILITY=default asks for it, may round a * b + c twice,
// so the ATen ops run instead.
#define OS_AVX2 __attribute__((target("avx2,fma"), optimize("O3")))

template <bool kSmall1, bool kSmall2, bool kNesterov, typename Out>
OS_AVX2 void MomentumAvx2(float* m, const float* g, Out* out, float c1, float c2, int64_t b,
                          int64_t e) {
  MomentumLoop<kSmall1, kSmall2, kNesterov>(m, g, out, c1, c2, b, e);
}

template <typename Update>
OS_AVX2 void DecayAddAvx2(float* p, const Update* u, float decay, float alpha, int64_t b,
                          int64_t e) {
  DecayAddLoop(p, u, decay, alpha, b, e);
}

template <bool kSmall, bool kDecay>
OS_AVX2 void AdamWMomentsAvx2(float* p, const float* g, float* m, float* v,
                              const AdamWConstants& k, int64_t b, int64_t e) {
  AdamWMomentsLoop<kSmall, kDecay>(p, g, m, v, k, b, e);
}

OS_AVX2 void AdamWApplyAvx2(float* p, const float* m, const float* sqrt_v,
                            const AdamWConstants& k, int64_t b, int64_t e) {
  AdamWApplyLoop(p, m, sqrt_v, k, b, e);
}

template <bool kSmall1, bool kSmall2, bool kNesterov, typename Out>
void RunMomentum(float* m, const float* g, Out* out, float c1, float c2, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    MomentumAvx2<kSmall1, kSmall2, kNesterov>(m, g, out, c1, c2, b, e);
  });
}

// Peels the run-time flags into template arguments, one at a time.
template <bool... kFlags, typename Out, typename... Bools>
void DispatchMomentum(float* m, const float* g, Out* out, float c1, float c2, int64_t n, bool flag,
                      Bools... rest) {
  if constexpr (sizeof...(rest) == 0) {
    if (flag) {
      RunMomentum<kFlags..., true>(m, g, out, c1, c2, n);
    } else {
      RunMomentum<kFlags..., false>(m, g, out, c1, c2, n);
    }
  } else {
    if (flag) {
      DispatchMomentum<kFlags..., true>(m, g, out, c1, c2, n, rest...);
    } else {
      DispatchMomentum<kFlags..., false>(m, g, out, c1, c2, n, rest...);
    }
  }
}

bool IsDenseCpu(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.is_contiguous() && !t.is_conj() && !t.is_neg() &&
         t.layout() == at::kStrided;
}

}  // namespace

bool AtenKernelsUseFma() {
  static const bool has = [] {
    const std::string capability = at::get_cpu_capability();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           (capability == "AVX2" || capability == "AVX512");
  }();
  return has;
}

bool CanFuseMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu) {
  return mu != 0.0 && AtenKernelsUseFma() && IsDenseCpu(momentum) && IsDenseCpu(grad) &&
         momentum.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat &&
         grad.numel() == momentum.numel() && !momentum.is_same(grad);
}

bool CanFuseDecayAdd(const at::Tensor& param, const at::Tensor& update) {
  return AtenKernelsUseFma() && IsDenseCpu(param) && IsDenseCpu(update) &&
         param.scalar_type() == at::kFloat &&
         (update.scalar_type() == at::kFloat || update.scalar_type() == at::kBFloat16) &&
         param.numel() == update.numel() && !param.is_same(update);
}

at::Tensor FusedMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu,
                         bool nesterov, at::ScalarType out_type) {
  TORCH_CHECK(out_type == at::kFloat || out_type == at::kBFloat16,
              "FusedMomentum: out_type must be float or bfloat16, got ", out_type);
  const at::Tensor out = at::empty(grad.sizes(), grad.options().dtype(out_type));
  // As ATen: the Scalar weight is rounded to float, then w - 1 is taken in float.
  const float w1 = static_cast<float>(1.0 - mu);
  const float w2 = static_cast<float>(mu);
  const bool small1 = w1 < 0.5f && w1 > -0.5f;
  const bool small2 = w2 < 0.5f && w2 > -0.5f;
  const float c1 = small1 ? w1 : w1 - 1.0f;
  const float c2 = small2 ? w2 : w2 - 1.0f;
  float* m = momentum.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  const int64_t n = momentum.numel();
  if (out.scalar_type() == at::kBFloat16) {
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    DispatchMomentum(m, g, o, c1, c2, n, small1, small2, nesterov);
  } else {
    DispatchMomentum(m, g, out.data_ptr<float>(), c1, c2, n, small1, small2, nesterov);
  }
  return out;
}

bool CanFuseAdamW(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, double beta1) {
  if (beta1 == 0.0 || !AtenKernelsUseFma()) return false;  // lerp weight 1: see CanFuseMomentum
  const int64_t n = param.numel();
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!IsDenseCpu(*t) || t->scalar_type() != at::kFloat || t->numel() != n) return false;
  }
  // Distinct tensors: with aliases, ATen's separate ops would read what an earlier op wrote.
  const at::Tensor* all[] = {&param, &grad, &exp_avg, &exp_avg_sq};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      if (all[i]->is_same(*all[j])) return false;
    }
  }
  return true;
}

void FusedAdamW(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const AdamWScalars& s) {
  AdamWConstants k;
  k.decay = static_cast<float>(s.decay);
  const float w = static_cast<float>(1.0 - s.beta1);
  const bool small = w < 0.5f && w > -0.5f;
  k.lerp_coeff = small ? w : w - 1.0f;
  k.beta2 = static_cast<float>(s.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - s.beta2);
  k.bc2_sqrt = static_cast<float>(s.bias_correction2_sqrt);
  k.eps = static_cast<float>(s.eps);
  k.neg_step_size = static_cast<float>(-s.step_size);
  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  const int64_t n = param.numel();
  // Block by block, so that each block's moments, square roots and update stay in cache: one trip
  // through memory. The square root is ATen's own (not correctly rounded on every element, so no
  // instruction can stand in for it); its result does not depend on where a block starts or ends
  // (checked by the test against ATen on whole tensors).
  auto step = [&](auto small_tag, auto decay_tag) {
    constexpr bool kSmall = decltype(small_tag)::value;
    constexpr bool kDecay = decltype(decay_tag)::value;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      const at::Tensor sqrt_buf = at::empty({std::min(kAdamWBlock, end - begin)}, at::kFloat);
      float* r = sqrt_buf.data_ptr<float>();
      for (int64_t b = begin; b < end; b += kAdamWBlock) {
        const int64_t e = std::min(b + kAdamWBlock, end);
        AdamWMomentsAvx2<kSmall, kDecay>(p, g, m, v, k, b, e);
        at::Tensor out = sqrt_buf.narrow(0, 0, e - b);
        at::sqrt_out(out, exp_avg_sq.view({-1}).narrow(0, b, e - b));
        AdamWApplyAvx2(p + b, m + b, r, k, 0, e - b);
      }
    });
  };
  using T = std::true_type;
  using F = std::false_type;
  if (small) {
    s.apply_decay ? step(T{}, T{}) : step(T{}, F{});
  } else {
    s.apply_decay ? step(F{}, T{}) : step(F{}, F{});
  }
}

void FusedDecayAdd(const at::Tensor& param, double decay, const at::Tensor& update, double alpha) {
  const float d = static_cast<float>(decay);
  const float a = static_cast<float>(alpha);
  float* p = param.data_ptr<float>();
  const int64_t n = param.numel();
  auto run = [&](const auto* u) {
    at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { DecayAddAvx2(p, u, d, a, b, e); });
  };
  if (update.scalar_type() == at::kBFloat16) {
    run(reinterpret_cast<const uint16_t*>(update.data_ptr<at::BFloat16>()));
  } else {
    run(update.data_ptr<float>());
  }
}

}  // namespace orthoshard::optimizers::internal
