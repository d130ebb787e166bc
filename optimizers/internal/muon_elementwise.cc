#include "optimizers/internal/muon_elementwise.h"

#include <cstdint>
#include <cstring>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/BFloat16.h>

namespace orthoshard::optimizers::internal {
namespace {

// Elements per parallel chunk: large enough that a chunk amortises the thread hand-off, small
// enough that both cores get work on tensors of a few MB (ATen's own grain is 32768).
constexpr int64_t kGrain = 32768;

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

// The loops compiled for AVX2 + FMA (vectorised, hardware fma), whatever the build's baseline ISA.
// Only used where the CPU has both (HasAvx2Fma), which is also where ATen's own kernels use fma:
// on an older CPU ATen's generic kernels may round a * b + c twice, so the ATen ops run instead.
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

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
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

bool CanFuseMomentum(const at::Tensor& momentum, const at::Tensor& grad, double mu) {
  return mu != 0.0 && HasAvx2Fma() && IsDenseCpu(momentum) && IsDenseCpu(grad) &&
         momentum.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat &&
         grad.numel() == momentum.numel() && !momentum.is_same(grad);
}

bool CanFuseDecayAdd(const at::Tensor& param, const at::Tensor& update) {
  return HasAvx2Fma() && IsDenseCpu(param) && IsDenseCpu(update) &&
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
