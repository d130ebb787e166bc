// A user's program on orthoshard's library targets, built from another workspace: plans the
// layer-wise layout of a small model at dp 4 and takes a few Muon + AdamW steps on it, then prints
// what it did. Exits 0 only when the plan pads nothing and the loss falls.
#include <cstdio>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "layout/layout.h"
#include "optimizers/chained.h"

int main() {
  using namespace orthoshard;  // NOLINT: a short example
  std::vector<layout::ParamSpec> specs;
  for (int i = 0; i < 8; ++i) {
    layout::ParamSpec spec;
    spec.name = "layers." + std::to_string(i) + ".weight";
    spec.shape = {64, 64};
    spec.role = layout::ParamRole::kMuon;
    specs.push_back(spec);
  }
  layout::LayoutOptions options;
  options.dp = 4;
  const absl::StatusOr<layout::FullParamLayout> plan = layout::ComputeFullParamLayout(specs, options);
  if (!plan.ok()) {
    std::fprintf(stderr, "layout: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  const layout::PerBufferParamLayout& buffer = plan->buffers.front();
  const int64_t padding = buffer.numel() - buffer.unpadded_numel;
  std::printf("layerwise layout at dp 4: %zu params, %lld elements, %lld padding\n",
              buffer.params.size(), static_cast<long long>(buffer.unpadded_numel),
              static_cast<long long>(padding));

  // Fit W x = y for a random 64x64 target with Muon (hidden matrix) and AdamW (bias).
  at::Tensor weight = at::randn({64, 64}).mul_(0.1);
  at::Tensor bias = at::zeros({64});
  const at::Tensor target = at::randn({64, 64}).mul_(0.1);
  const at::Tensor x = at::randn({64, 32});
  at::Tensor weight_grad = at::zeros_like(weight), bias_grad = at::zeros_like(bias);
  std::vector<optimizers::Param> params = {{"hidden.weight", weight, weight_grad, {}},
                                           {"hidden.bias", bias, bias_grad, {}}};
  optimizers::ChainedConfig config;
  config.muon.lr = 0.02;
  auto opt = optimizers::ChainedOptimizer::Create(std::move(params), config);
  if (!opt.ok()) {
    std::fprintf(stderr, "optimizer: %s\n", opt.status().ToString().c_str());
    return 1;
  }
  std::printf("%s", (*opt)->routing_report().ToString().c_str());
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    const at::Tensor error = weight.mm(x).add(bias.unsqueeze(1)).sub(target.mm(x));
    const double loss = error.pow(2).mean().item<double>();
    if (step == 0) first = loss;
    last = loss;
    weight_grad.copy_(error.mm(x.t()).mul(2.0 / error.numel()));
    bias_grad.copy_(error.sum(1).mul(2.0 / error.numel()));
    if (!(*opt)->Step().ok()) return 1;
  }
  std::printf("loss %.5f -> %.5f after 20 steps\n", first, last);
  return padding == 0 && last < first ? 0 : 1;
}
