#include "optimizers/distributed/testing/test_model.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/round.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "buffers/bucket_sync.h"
#include "common/status_macros.h"

namespace orthoshard::optimizers::distributed::testing {
namespace {

using layout::ParamRole;
using layout::ParamSpec;

ParamSpec Spec(std::string name, std::vector<int64_t> shape, ParamRole role) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.dtype = DType::kBFloat16;
  s.role = role;
  return s;
}

// Deterministic values sin(i * a + b), as fp32.
at::Tensor Wave(int64_t numel, double a, double b) {
  return at::sin(at::arange(numel, at::kFloat).mul_(a).add_(b));
}

}  // namespace

std::vector<ParamSpec> SmallModel(int num_layers, bool only_two_matrices) {
  std::vector<ParamSpec> specs;
  ParamSpec embed = Spec("embedding.weight", {24, 16}, ParamRole::kAdam);
  embed.shared_embedding = true;
  specs.push_back(embed);
  for (int l = 0; l < num_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    specs.push_back(Spec(p + "input_norm.weight", {16}, ParamRole::kAdam));
    specs.push_back(Spec(p + "attn.qkv.weight", {48, 16}, ParamRole::kMuon));
    if (!only_two_matrices) specs.push_back(Spec(p + "attn.proj.weight", {16, 16}, ParamRole::kMuon));
    specs.push_back(Spec(p + "mlp_norm.weight", {16}, ParamRole::kAdam));
    if (!only_two_matrices) specs.push_back(Spec(p + "mlp.fc1.weight", {40, 16}, ParamRole::kMuon));
    specs.push_back(Spec(p + "mlp.fc1.bias", {40}, ParamRole::kAdam));
    specs.push_back(Spec(p + "mlp.fc2.weight", {16, 40}, ParamRole::kMuon));
  }
  specs.push_back(Spec("final_norm.weight", {16}, ParamRole::kAdam));
  return specs;
}

std::map<std::string, FusedSplit> SmallModelSplits(const std::vector<ParamSpec>& specs) {
  std::map<std::string, FusedSplit> splits;
  for (const ParamSpec& spec : specs) {
    if (absl::EndsWith(spec.name, ".attn.qkv.weight")) splits[spec.name] = {2, {16, 4, 4}};
    if (absl::EndsWith(spec.name, ".mlp.fc1.weight")) splits[spec.name] = {1, {20, 20}};
  }
  return splits;
}

std::vector<ParamSpec> LargeModel(int n, int64_t rows, int64_t cols, int64_t vocab) {
  std::vector<ParamSpec> specs;
  specs.push_back(Spec("embedding.weight", {vocab, cols}, ParamRole::kAdam));
  for (int i = 0; i < n; ++i) {
    specs.push_back(Spec(absl::StrCat("layers.", i, ".norm.weight"), {rows}, ParamRole::kAdam));
    specs.push_back(Spec(absl::StrCat("layers.", i, ".linear.weight"), {rows, cols},
                         ParamRole::kMuon));
  }
  return specs;
}

std::vector<at::Tensor> MakeModelParams(const std::vector<ParamSpec>& specs) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor t = Wave(specs[i].numel(), 0.731, 0.1 * static_cast<double>(i)).mul_(0.2);
    if (specs[i].shape.size() == 1) t.add_(1.0);  // norm-like
    params.push_back(t.view(specs[i].shape).to(buffers::ToScalarType(specs[i].dtype)));
  }
  return params;
}

// Multiples of 2^-6 in [-1, 1]: their sums over ranks, and the sums of their squares over any
// slice of a tensor, are exact in fp32 in any order (the largest sum of squares here, 198, stays far
// below 2^24 * 2^-12), so the distributed and single-process gradients and per-slice sums of squares
// are bitwise equal whatever Gloo's summation order and wherever the shards are cut.
at::Tensor RankGrad(const ParamSpec& spec, int index, int rank, int step) {
  at::Tensor g = Wave(spec.numel(), 0.37 + 0.01 * rank, index * 13.0 + rank * 7.0 + step * 3.0);
  return at::round(g.mul_(64.0)).div_(64.0).view(spec.shape);
}

at::Tensor MeanGrad(const ParamSpec& spec, int index, int dp, int step) {
  at::Tensor sum = RankGrad(spec, index, 0, step).clone();
  for (int r = 1; r < dp; ++r) sum.add_(RankGrad(spec, index, r, step));
  return sum.div_(dp);
}

absl::StatusOr<DistributedModel> BuildDistributedModel(const std::vector<ParamSpec>& specs, int dp,
                                                       layout::Strategy muon_strategy,
                                                       int64_t bucket_size,
                                                       buffers::Residency residency, int rank) {
  layout::LayoutOptions options;
  options.dp = dp;
  options.bucket_size = bucket_size;
  options.muon_strategy = muon_strategy;
  DistributedModel model;
  ASSIGN_OR_RETURN(model.layout, layout::ComputeFullParamLayout(specs, options));
  model.params = MakeModelParams(specs);
  buffers::BufferOptions buffer_options;
  buffer_options.residency = residency;
  buffer_options.rank = rank;
  for (const layout::PerBufferParamLayout& b : model.layout.buffers) {
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(b, model.params, buffer_options));
    model.buffers.push_back(buffer.get());
    model.owned_buffers.push_back(std::move(buffer));
  }
  return model;
}

void FillRankGrads(const std::vector<ParamSpec>& specs, DistributedModel& model, int rank,
                   int step) {
  for (buffers::ParamAndGradBuffer* buffer : model.buffers) {
    for (int b = 0; b < buffer->num_buckets(); ++b) buffer->MaterializeGrads(b);
    buffer->ZeroGrads();
    for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
      const int index = buffer->layout().params[i].param_index;
      buffer->GradView(i).copy_(RankGrad(specs[index], index, rank, step));
    }
  }
}

void ReleaseFullGrads(DistributedModel& model) {
  for (buffers::ParamAndGradBuffer* buffer : model.buffers) {
    for (int b = 0; b < buffer->num_buckets(); ++b) buffer->ReleaseGrads(b);
  }
}

absl::StatusOr<std::vector<at::Tensor>> WholeParams(collectives::Communicator& comm,
                                                    DistributedModel& model) {
  std::vector<at::Tensor> whole(model.params.size());
  for (buffers::ParamAndGradBuffer* buffer : model.buffers) {
    const bool sharded = buffer->residency() == buffers::Residency::kSharded;
    for (int b = 0; b < buffer->num_buckets(); ++b) {
      if (sharded) {
        buffer->MaterializeParams(b);
        ASSIGN_OR_RETURN(auto work,
                         comm.LaunchGroup(buffers::ParamSyncOps(*buffer, {b}, comm.rank())));
        RETURN_IF_ERROR(work->Wait(comm.timeout()));
      }
      for (int i : buffer->BucketParams(b)) {
        whole[buffer->layout().params[i].param_index] = buffer->Param(i).detach().clone();
      }
      if (sharded) buffer->ReleaseParams(b);
    }
  }
  return whole;
}

ChainedConfig TestConfig(double max_grad_norm) {
  ChainedConfig config;
  config.adamw.lr = 1e-2;
  config.adamw.weight_decay = 0.05;
  config.adamw_non_matrix_weight_decay = 0.0;
  config.muon.lr = 2e-2;
  config.muon.weight_decay = 0.1;
  config.max_grad_norm = max_grad_norm;
  config.schedule.kind = ScheduleKind::kWarmupCosine;
  config.schedule.warmup_steps = 2;
  config.schedule.total_steps = 20;
  return config;
}

absl::Status CompareParamsBitwise(const std::vector<ParamSpec>& specs,
                                  const std::vector<at::Tensor>& got,
                                  const std::vector<at::Tensor>& want, const std::string& when) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!at::equal(got[i], want[i])) {
      const double diff =
          got[i].to(at::kFloat).sub(want[i].to(at::kFloat)).abs().max().item().toDouble();
      return absl::InternalError(absl::StrCat(when, ": param '", specs[i].name,
                                              "' differs from the reference (max |diff| ", diff,
                                              ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

absl::StatusOr<std::unique_ptr<Reference>> Reference::Create(
    const std::vector<ParamSpec>& specs, const ChainedConfig& config,
    const std::map<std::string, FusedSplit>& splits) {
  auto ref = std::make_unique<Reference>();
  ref->specs_ = specs;
  ref->params_ = MakeModelParams(specs);
  std::vector<Param> params;
  for (size_t i = 0; i < specs.size(); ++i) {
    ref->grads_.push_back(at::zeros(specs[i].shape, at::kFloat));
    auto it = splits.find(specs[i].name);
    params.push_back({specs[i].name, ref->params_[i], ref->grads_[i],
                      it == splits.end() ? FusedSplit{} : it->second});
  }
  ASSIGN_OR_RETURN(ref->optimizer_, ChainedOptimizer::Create(std::move(params), config));
  return ref;
}

absl::StatusOr<StepResult> Reference::Step(int dp, int step, int nan_param,
                                           const GradStats* global) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    grads_[i].copy_(MeanGrad(specs_[i], static_cast<int>(i), dp, step));
  }
  if (nan_param >= 0) grads_[nan_param].view({-1})[0].fill_(std::nan(""));
  return global != nullptr ? optimizer_->StepWithStats(*global) : optimizer_->Step();
}

}  // namespace orthoshard::optimizers::distributed::testing
