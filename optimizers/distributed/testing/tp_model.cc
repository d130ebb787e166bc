#include "optimizers/distributed/testing/tp_model.h"

#include <cmath>
#include <memory>
#include <utility>

#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "optimizers/tp_muon.h"

namespace orthoshard::optimizers::distributed::testing {

using layout::ParamRole;

std::vector<TpParam> GptLike(int layers) {
  std::vector<TpParam> ps;
  ps.push_back({"embedding.weight", {32, 16}, 0, 1, ParamRole::kAdam, {}});
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    ps.push_back({p + "input_norm.weight", {16}, -1, 1, ParamRole::kAdam, {}});
    ps.push_back({p + "attn.qkv.weight", {32, 16}, 0, 1, ParamRole::kMuon, {2, {8, 4, 4}}});
    ps.push_back({p + "attn.proj.weight", {16, 16}, 1, 1, ParamRole::kMuon, {}});
    ps.push_back({p + "mlp_norm.weight", {16}, -1, 1, ParamRole::kAdam, {}});
    ps.push_back({p + "mlp.fc1.weight", {48, 16}, 0, 2, ParamRole::kMuon, {1, {24, 24}}});
    ps.push_back({p + "mlp.fc2.weight", {16, 24}, 1, 1, ParamRole::kMuon, {}});
  }
  ps.push_back({"final_norm.weight", {16}, -1, 1, ParamRole::kAdam, {}});
  return ps;
}

std::vector<TpParam> Gpt2Matrices(int layers) {
  std::vector<TpParam> ps;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    ps.push_back({p + "attn.qkv.weight", {2304, 768}, 0, 1, ParamRole::kMuon, {12, {64, 64, 64}}});
    ps.push_back({p + "attn.proj.weight", {768, 768}, 1, 1, ParamRole::kMuon, {}});
    ps.push_back({p + "mlp.fc1.weight", {4096, 768}, 0, 2, ParamRole::kMuon, {1, {2048, 2048}}});
    ps.push_back({p + "mlp.fc2.weight", {768, 2048}, 1, 1, ParamRole::kMuon, {}});
  }
  return ps;
}

TpSplit SplitOf(const TpParam& p, int tp, int tp_rank) {
  return p.dim < 0 ? TpSplit{} : TpSplit{p.dim, p.parts, tp, tp_rank};
}

std::vector<layout::ParamSpec> GlobalSpecs(const std::vector<TpParam>& ps) {
  std::vector<layout::ParamSpec> specs;
  for (const TpParam& p : ps) {
    layout::ParamSpec s;
    s.name = p.name;
    s.shape = p.shape;
    s.dtype = DType::kBFloat16;
    s.role = p.role;
    specs.push_back(std::move(s));
  }
  return specs;
}

std::map<std::string, FusedSplit> GlobalSplits(const std::vector<TpParam>& ps) {
  std::map<std::string, FusedSplit> splits;
  for (const TpParam& p : ps) {
    if (!p.split.block_rows.empty()) splits[p.name] = p.split;
  }
  return splits;
}

at::Tensor SliceOf(const TpParam& p, int tp, int tp_rank, const at::Tensor& global) {
  const TpSplit split = SplitOf(p, tp, tp_rank);
  return split.split() ? TpSliceOf(global, split) : global.contiguous();
}

absl::StatusOr<DistributedModel> BuildTpModel(const std::vector<TpParam>& ps, int tp, int tp_rank,
                                              int dp, int64_t bucket_size, bool with_values) {
  std::vector<layout::ParamSpec> specs = GlobalSpecs(ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    specs[i].tp = SplitOf(ps[i], tp, tp_rank);
    specs[i].shape = TpLocalShape(ps[i].shape, specs[i].tp);
  }
  layout::LayoutOptions options;
  options.dp = dp;
  options.bucket_size = bucket_size;
  options.muon_strategy = layout::Strategy::kLayerwise;
  DistributedModel model;
  ASSIGN_OR_RETURN(model.layout, layout::ComputeFullParamLayout(specs, options));
  if (with_values) {
    const std::vector<at::Tensor> global = MakeModelParams(GlobalSpecs(ps));
    for (size_t i = 0; i < ps.size(); ++i) {
      model.params.push_back(SliceOf(ps[i], tp, tp_rank, global[i]));
    }
  } else {
    for (const layout::ParamSpec& s : specs) {
      model.params.push_back(at::zeros(s.shape, at::kBFloat16));
    }
  }
  for (const layout::PerBufferParamLayout& b : model.layout.buffers) {
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(b, model.params));
    model.buffers.push_back(buffer.get());
    model.owned_buffers.push_back(std::move(buffer));
  }
  return model;
}

void FillTpGrads(const std::vector<TpParam>& ps, DistributedModel& model, int tp, int tp_rank,
                 int dp_rank, int step, const std::string& poison_param) {
  const std::vector<layout::ParamSpec> global = GlobalSpecs(ps);
  for (buffers::ParamAndGradBuffer* buffer : model.buffers) {
    buffer->grad_data().zero_();
    const std::vector<layout::ParamPlacement>& placements = buffer->layout().params;
    for (int j = 0; j < static_cast<int>(placements.size()); ++j) {
      const int i = placements[j].param_index;
      at::Tensor g = SliceOf(ps[i], tp, tp_rank, RankGrad(global[i], i, dp_rank, step));
      if (!poison_param.empty() && ps[i].name == poison_param) g.view({-1})[0].fill_(NAN);
      buffer->GradView(j).copy_(g);
    }
  }
}

}  // namespace orthoshard::optimizers::distributed::testing
