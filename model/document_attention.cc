#include "model/document_attention.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

#include "model/qk_clip.h"

namespace orthoshard::model {
namespace {

at::Tensor CausalSdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/q.size(1) > k.size(1));
}

// The parts of t [B, N, T, D] that each group of `runs` attends alone: t's rows in group order,
// split into the groups' rows ([rows_g, N, T, D] each). Split, not narrow: narrow's backward
// allocates a zero tensor of the whole input per part (see Gpt::Block).
std::vector<at::Tensor> GroupParts(const DocumentRuns& runs, const at::Tensor& t) {
  const at::Tensor ordered = runs.row_order.defined() ? t.index_select(0, runs.row_order) : t;
  if (runs.group_rows.size() == 1) return {ordered};
  return ordered.split_with_sizes(runs.group_rows, 0);
}

}  // namespace

DocumentRuns PlanDocumentRuns(const at::Tensor& segments) {
  const at::Tensor host = segments.to(at::kCPU).contiguous();
  const int64_t B = host.size(0), T = host.size(1);
  const int64_t* s = host.data_ptr<int64_t>();
  DocumentRuns runs;
  std::map<std::vector<int64_t>, int64_t> group_of_lengths;
  std::vector<int64_t> group_of_row(B);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> lengths;
    int64_t start = 0;
    for (int64_t t = 1; t <= T; ++t) {
      if (t == T || s[b * T + t] != s[b * T + t - 1]) {
        lengths.push_back(t - start);
        start = t;
      }
    }
    const auto [it, added] =
        group_of_lengths.emplace(lengths, static_cast<int64_t>(runs.group_lengths.size()));
    if (added) {
      runs.group_lengths.push_back(std::move(lengths));
      runs.group_rows.push_back(0);
    }
    group_of_row[b] = it->second;
    ++runs.group_rows[it->second];
  }
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return group_of_row[x] < group_of_row[y]; });
  if (!std::is_sorted(group_of_row.begin(), group_of_row.end())) {
    std::vector<int64_t> inverse(B);
    for (int64_t i = 0; i < B; ++i) inverse[order[i]] = i;
    const at::TensorOptions options = segments.options().dtype(at::kLong);
    runs.row_order = at::tensor(order, at::TensorOptions().dtype(at::kLong)).to(options.device());
    runs.inverse_order =
        at::tensor(inverse, at::TensorOptions().dtype(at::kLong)).to(options.device());
  }
  return runs;
}

at::Tensor DocumentSdpa(const DocumentRuns& runs, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v) {
  if (runs.causal()) return CausalSdpa(q, k, v);
  const std::vector<at::Tensor> qg = GroupParts(runs, q), kg = GroupParts(runs, k),
                                vg = GroupParts(runs, v);
  std::vector<at::Tensor> groups;
  groups.reserve(qg.size());
  for (size_t g = 0; g < qg.size(); ++g) {
    const std::vector<int64_t>& lengths = runs.group_lengths[g];
    if (lengths.size() == 1) {
      groups.push_back(CausalSdpa(qg[g], kg[g], vg[g]));
      continue;
    }
    const std::vector<at::Tensor> qd = qg[g].split_with_sizes(lengths, 2),
                                  kd = kg[g].split_with_sizes(lengths, 2),
                                  vd = vg[g].split_with_sizes(lengths, 2);
    std::vector<at::Tensor> outputs;
    outputs.reserve(lengths.size());
    for (size_t d = 0; d < lengths.size(); ++d) outputs.push_back(CausalSdpa(qd[d], kd[d], vd[d]));
    groups.push_back(at::cat(outputs, 2));
  }
  const at::Tensor y = groups.size() == 1 ? groups[0] : at::cat(groups, 0);
  return runs.inverse_order.defined() ? y.index_select(0, runs.inverse_order) : y;
}

at::Tensor DocumentMaxAttentionLogits(const DocumentRuns& runs, const at::Tensor& q,
                                      const at::Tensor& k) {
  at::NoGradGuard no_grad;
  if (runs.causal()) return MaxAttentionLogits(q, k, at::Tensor());
  const std::vector<at::Tensor> qg = GroupParts(runs, q), kg = GroupParts(runs, k);
  at::Tensor best = at::full({q.size(1)}, -std::numeric_limits<float>::infinity(),
                             q.options().dtype(at::kFloat));
  for (size_t g = 0; g < qg.size(); ++g) {
    const std::vector<int64_t>& lengths = runs.group_lengths[g];
    const std::vector<at::Tensor> qd = qg[g].split_with_sizes(lengths, 2),
                                  kd = kg[g].split_with_sizes(lengths, 2);
    for (size_t d = 0; d < lengths.size(); ++d) {
      best = at::maximum(best, MaxAttentionLogits(qd[d], kd[d], at::Tensor()));
    }
  }
  return best;
}

at::Tensor DocumentMask(const at::Tensor& segments) {
  const int64_t T = segments.size(1);
  return segments.unsqueeze(2)
      .eq(segments.unsqueeze(1))
      .logical_and_(at::ones({T, T}, segments.options().dtype(at::kBool)).tril_())
      .unsqueeze(1);
}

}  // namespace orthoshard::model
