#include "model/qk_clip.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace orthoshard::model {

at::Tensor MaxAttentionLogits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask,
                              int64_t block_elements) {
  at::NoGradGuard no_grad;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), R = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));  // SDPA's default scale
  // [B, KV, R, T, D]: query head h = g R + r reads key head g (enable_gqa's grouping).
  const at::Tensor q5 = q.detach().to(at::kFloat).reshape({B, KV, R, T, D});
  const at::Tensor kt = k.detach().to(at::kFloat).unsqueeze(2).transpose(-2, -1);  // [B,KV,1,D,T]
  at::Tensor best = at::full({KV, R}, -std::numeric_limits<float>::infinity(), q5.options());
  // Query positions per block, and rows per block once a whole row fits.
  const int64_t rows = std::clamp<int64_t>(block_elements / (H * T), 1, T);
  const int64_t batch = rows == T ? std::clamp<int64_t>(block_elements / (H * T * T), 1, B) : 1;
  for (int64_t b0 = 0; b0 < B; b0 += batch) {
    const int64_t nb = std::min(batch, B - b0);
    for (int64_t t0 = 0; t0 < T; t0 += rows) {
      const int64_t nt = std::min(rows, T - t0);
      const int64_t keys = t0 + nt;  // later keys are never attended (causal)
      at::Tensor logits = at::matmul(q5.narrow(0, b0, nb).narrow(3, t0, nt),
                                     kt.narrow(0, b0, nb).narrow(4, 0, keys));  // [nb,KV,R,nt,keys]
      logits.mul_(scale);
      const at::Tensor allowed =
          mask.defined()
              ? mask.narrow(0, b0, nb).narrow(2, t0, nt).narrow(3, 0, keys).unsqueeze(1)
              : at::ones({nt, keys}, q.options().dtype(at::kBool)).tril_(t0);  // j <= t0 + i
      logits.masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
      best = at::maximum(best, logits.amax({0, 3, 4}));
    }
  }
  return best.reshape({H});
}

at::Tensor QkClipRowScales(const GptConfig& config, const at::Tensor& max_logits, double tau,
                           int64_t* clipped_groups, const TpSplit& tp) {
  const int64_t H = config.num_heads, KV = config.num_kv_heads, R = H / KV;
  const int64_t D = config.hidden / H;
  const at::Tensor logits = max_logits.detach().to(at::kCPU, at::kFloat).contiguous();
  const float* s = logits.data_ptr<float>();
  std::vector<float> factors;
  factors.reserve(static_cast<size_t>((H + 2 * KV) * D / std::max(tp.size, 1)));
  int64_t clipped = 0;
  // The groups whose rows this (shard of the) weight holds.
  const int64_t groups = tp.split() ? KV / tp.size : KV;
  const int64_t first = tp.split() ? tp.rank * groups : 0;
  for (int64_t g = first; g < first + groups; ++g) {
    double group_max = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < R; ++r) group_max = std::max(group_max, double{s[g * R + r]});
    // gamma = tau / S_g < 1 for a group above tau; q and k each take gamma^(1/2).
    const bool clip = group_max > tau;
    const float qk = clip ? static_cast<float>(std::sqrt(tau / group_max)) : 1.0f;
    clipped += clip;
    factors.insert(factors.end(), static_cast<size_t>((R + 1) * D), qk);  // query heads, key
    factors.insert(factors.end(), static_cast<size_t>(D), 1.0f);          // value
  }
  if (clipped_groups != nullptr) *clipped_groups = clipped;
  return at::tensor(factors, at::kFloat);
}

}  // namespace orthoshard::model
