// End-to-end equivalence of DDP + the distributed optimizer with real Gloo ranks at 1, 2, 3 and 4
// processes (the multi-rank harness, //collectives:multi_rank). End-to-end proof that ddp/ and
// optimizers/distributed/ compose: a small transformer-like model built from at:: ops (embedding,
// residual MLP blocks with RMS norms, an output head) trains for kSteps steps on a global batch of
// kGlobalBatch samples split across ranks (each rank its slice, loss = mean over the slice; DDP
// averages, giving the mean over the global batch). Real backward runs through DDP's gradient
// hooks; the forward calls DDP's pre-forward hook per layer. Every configuration -- mode (sharded:
// layer-wise Muon + ZeRO-1 AdamW; replicated: every rank steps everything; fsdp: sharded with
// sharded params) x overlap_grad_reduce x overlap_param_gather (or, for fsdp,
// reshard_after_forward) x micro-batches (1 or 2) -- is checked against a single-process reference
// stepped alongside it (SimulatedRanks below), on any CPU:
//
//  (A) The gradient. At every step, the mean gradient DDP leaves on the ranks (the reduced shards,
//      all-gathered by the test into scratch memory) is compared with the reference's, computed at
//      the same params as N ranks of M micro-batches would: each rank's slice, micro-batches
//      accumulated by autograd, times 1/N (exactly DDP's pre-scale), then summed in rank order.
//      Every addend x_r is then bitwise the same on both sides (same ops, same shapes, same
//      machine); only the order of the cross-rank sum is Gloo's. A sum of two addends does not
//      depend on the order, so at N <= 2 the gradient must be bitwise equal. At N >= 3, any order
//      or tree of N - 1 fp32 additions is within gamma(N - 1) * sum_r |x_r| of the exact sum
//      (Higham, "Accuracy and Stability of Numerical Algorithms", 4.2; gamma(k) = k u / (1 - k u),
//      u = 2^-24), so the two sums differ by at most 2 gamma(N - 1) sum_r |x_r|, per element: that
//      is the bound, computed from the addends themselves. A missed bucket, a wrong scale or a
//      stale shard is off by a whole addend.
//  (B) The step. The reference ChainedOptimizer is given that distributed gradient and the global
//      statistics the distributed optimizer all-reduced (StepResult::stats), so it clips, skips
//      and schedules exactly alike; Muon (bf16 Newton-Schulz, the default) and AdamW then see the
//      same inputs, and the params every rank holds after the param sync must be bitwise equal to
//      the reference's, at every step and every N. This also keeps both runs on the same params,
//      so (A) compares gradients at identical points.
//  (S) The statistics. The global sum of squares the ranks agreed on is compared with the
//      reference's from the same gradient: each side sums squared fp32 norms of (whole or sharded)
//      tensors of at most n elements, every norm within gamma(n) + 2u relative of the exact value
//      (a dot product of n terms, one sqrt, squared in double), so the two sums differ by at most
//      2.1 (gamma(n) + 2u) times the sum (2.1 covers the reference's own error in the scale).
//
// Also checked: every rank's params bitwise identical (rank 0's broadcast compared); overlap
// variants bitwise identical to the no-overlap run of the same mode and micro count; the overlap
// paths really ran; each Muon matrix owned by one rank; and at 1 rank with 1 micro-batch, where
// nothing differs from plain single-process training, the final params bitwise equal to a
// ChainedOptimizer run that computes its own gradients and statistics.
// Sharded residency (ZeRO-3: each rank keeps only its shards, params gathered per layer for forward
// and backward, fsdp_* configs, with and without reshard_after_forward) passes the same checks and
// must give params bitwise equal to the layer-wise run's (same values, same order), with no
// full-size param or grad storage left on any rank after backward or after a step.
// Clipping off, the three modes end at bitwise the same params at every N (UnclippedModesAgree):
// the grad sync sums every element in one order in every mode.
// Every rank prints "e2e config NAME max|grad diff| X (bound Y) ..." per configuration (2 models x
// 3 modes x (4 overlap variants + 1 unclipped) x 2 micro counts) and fails naming the config,
// step, param and difference otherwise.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "ddp/distributed_data_parallel.h"
#include "gtest/gtest.h"
#include "layout/layout.h"
#include "optimizers/chained.h"
#include "optimizers/distributed/distributed_optimizer.h"

namespace orthoshard::integration::e2e {
namespace {

using collectives::Communicator;
using layout::ParamRole;
using layout::ParamSpec;
using optimizers::distributed::CreateDistributedOptimizer;
using optimizers::distributed::DistributedMode;

constexpr int64_t kGlobalBatch = 24;  // divisible by 1..4 ranks x 2 micro-batches
constexpr int64_t kIn = 16, kHidden = 8, kOut = 4;
constexpr int kSteps = 4;

// A model: param specs in forward order, the layer of each (for the pre-forward hook), and the
// number of residual blocks.
struct Model {
  std::vector<ParamSpec> specs;
  std::vector<int> layers;
  int blocks = 0;
  int num_layers() const { return layers.back() + 1; }
};

ParamSpec Spec(std::string name, std::vector<int64_t> shape, ParamRole role) {
  ParamSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.dtype = DType::kFloat32;
  spec.role = role;
  return spec;
}

// Layer 0: embedding [kIn, kHidden] (AdamW, 2-D). Layer 1 + b per block b: norm, fc1 [w, kHidden]
// + bias, fc2 [kHidden, w] (two Muon matrices of varied widths). Last layer: final norm, output
// head [kOut, kHidden] (AdamW, 2-D).
Model MakeModel(int blocks) {
  Model m;
  m.blocks = blocks;
  m.specs.push_back(Spec("embedding.weight", {kIn, kHidden}, ParamRole::kAdam));
  m.layers.push_back(0);
  for (int b = 0; b < blocks; ++b) {
    const int64_t width = 12 + 8 * b;
    const std::string p = absl::StrCat("layers.", b, ".");
    m.specs.push_back(Spec(p + "norm.weight", {kHidden}, ParamRole::kAdam));
    m.specs.push_back(Spec(p + "fc1.weight", {width, kHidden}, ParamRole::kMuon));
    m.specs.push_back(Spec(p + "fc1.bias", {width}, ParamRole::kAdam));
    m.specs.push_back(Spec(p + "fc2.weight", {kHidden, width}, ParamRole::kMuon));
    for (int i = 0; i < 4; ++i) m.layers.push_back(1 + b);
  }
  m.specs.push_back(Spec("final_norm.weight", {kHidden}, ParamRole::kAdam));
  m.specs.push_back(Spec("output_layer.weight", {kOut, kHidden}, ParamRole::kAdam));
  m.layers.push_back(1 + blocks);
  m.layers.push_back(1 + blocks);
  return m;
}

at::Tensor Pattern(int64_t n, double phase, double freq) {
  return at::arange(n, at::kFloat).mul(freq).add(phase).sin();
}

std::vector<at::Tensor> MakeParams(const Model& model) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < model.specs.size(); ++i) {
    const ParamSpec& spec = model.specs[i];
    at::Tensor t = Pattern(spec.numel(), 0.7 * i, 0.37).mul(0.4);
    if (spec.shape.size() == 1 && spec.name.find("norm") != std::string::npos) t = t.add(1.0);
    params.push_back(t.reshape(spec.shape).clone().set_requires_grad(true));
  }
  return params;
}

// Inputs and targets of the whole global batch of `step`.
at::Tensor Inputs(int step) {
  return Pattern(kGlobalBatch * kIn, 0.1 + 0.9 * step, 0.53).reshape({kGlobalBatch, kIn});
}
at::Tensor Targets(int step) {
  return Pattern(kGlobalBatch * kOut, 0.4 + 1.1 * step, 0.29).mul(0.5).reshape({kGlobalBatch, kOut});
}

at::Tensor RmsNorm(const at::Tensor& h, const at::Tensor& weight) {
  return h.mul(h.pow(2).mean({-1}, /*keepdim=*/true).add(1e-6).rsqrt()).mul(weight);
}

// Sum over the rows of x of the squared error, divided by `norm`. DDP's layer hooks (may be null)
// run around each layer: pre_forward before it, post_forward with its output after it.
at::Tensor Loss(const Model& model, const std::vector<at::Tensor>& p, const at::Tensor& x,
                const at::Tensor& y, double norm, const ddp::LayerHooks* hooks) {
  auto layer = [&](int index, const std::function<at::Tensor()>& body) {
    if (hooks != nullptr) hooks->pre_forward(index);
    at::Tensor out = body();
    if (hooks != nullptr) hooks->post_forward(index, out);
    return out;
  };
  at::Tensor h = layer(0, [&] { return x.mm(p[0]); });
  for (int b = 0; b < model.blocks; ++b) {
    const int i = 1 + 4 * b;
    h = layer(1 + b, [&] {
      at::Tensor u = RmsNorm(h, p[i]).mm(p[i + 1].t()).add(p[i + 2]).tanh();
      return h.add(u.mm(p[i + 3].t()));
    });
  }
  const int i = 1 + 4 * model.blocks;
  at::Tensor out = layer(1 + model.blocks, [&] { return RmsNorm(h, p[i]).mm(p[i + 1].t()); });
  return out.sub(y).pow(2).sum().div(norm);
}

// `clip`: clipping by the global norm (max_grad_norm 1), else none (max_grad_norm 0).
optimizers::ChainedConfig Config(bool clip = true) {
  optimizers::ChainedConfig config;
  config.adamw.lr = 1e-2;
  config.adamw.weight_decay = 0.05;
  config.adamw_non_matrix_weight_decay = 0.0;
  config.muon.lr = 2e-2;
  config.muon.weight_decay = 0.1;
  config.max_grad_norm = clip ? 1.0 : 0.0;  // clipping by the global norm is exercised
  config.schedule.kind = optimizers::ScheduleKind::kWarmupCosine;
  config.schedule.warmup_steps = 2;
  config.schedule.total_steps = 20;
  return config;
}

// gamma(k) = k u / (1 - k u) with u = 2^-24, the fp32 unit roundoff: the relative error bound of k
// rounded fp32 operations in a row (Higham, 3.1).
double Gamma(int k) {
  const double u = std::ldexp(1.0, -24);
  return k * u / (1.0 - k * u);
}

// A ChainedOptimizer over the whole model in one process, and the gradient N ranks of M
// micro-batches would compute (see the file comment, (A) and (B)).
class SimulatedRanks {
 public:
  static absl::StatusOr<std::unique_ptr<SimulatedRanks>> Create(const Model& model, int world,
                                                                int micro, bool clip = true) {
    auto sim = std::unique_ptr<SimulatedRanks>(new SimulatedRanks(model, world, micro));
    std::vector<optimizers::Param> opt_params;
    for (size_t i = 0; i < sim->params_.size(); ++i) {
      sim->grads_.push_back(at::zeros(model.specs[i].shape, at::kFloat));
      opt_params.push_back({model.specs[i].name, sim->params_[i], sim->grads_[i], {}});
    }
    ASSIGN_OR_RETURN(sim->opt_,
                     optimizers::ChainedOptimizer::Create(std::move(opt_params), Config(clip)));
    return sim;
  }

  const std::vector<at::Tensor>& params() const { return params_; }

  // The mean gradient of `step`'s global batch at params(), as the ranks compute it: per param,
  // the sum over ranks r of x_r = (rank r's slice gradient, accumulated over micro-batches) * 1/N
  // in rank order, and sum_r |x_r| (the scale of the bound on another summation order).
  struct MeanGradient {
    std::vector<at::Tensor> mean;
    std::vector<at::Tensor> abs_sum;
  };
  MeanGradient Gradient(int step) {
    const at::Tensor x = Inputs(step), y = Targets(step);
    const int64_t slice = kGlobalBatch / world_, micro_rows = slice / micro_;
    MeanGradient g;
    for (int r = 0; r < world_; ++r) {
      for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
      for (int m = 0; m < micro_; ++m) {
        const int64_t start = r * slice + m * micro_rows;
        Loss(model_, params_, x.narrow(0, start, micro_rows), y.narrow(0, start, micro_rows), slice,
             nullptr)
            .backward();
      }
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) {
        // DDP's pre-scale (grads.mul_(1.0 / size) when size > 1).
        const at::Tensor addend = world_ > 1 ? params_[i].grad().mul(1.0 / world_)
                                             : params_[i].grad().clone();
        if (r == 0) {
          g.mean.push_back(addend);
          g.abs_sum.push_back(addend.abs());
        } else {
          g.mean[i].add_(addend);
          g.abs_sum[i].add_(addend.abs());
        }
      }
    }
    for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
    return g;
  }

  // One step on `grads` with the global statistics the distributed optimizer decided from.
  absl::StatusOr<optimizers::StepResult> Step(const std::vector<at::Tensor>& grads,
                                              const optimizers::GradStats& stats) {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < grads.size(); ++i) grads_[i].copy_(grads[i]);
    return opt_->StepWithStats(stats);
  }

  // The sums of squares of the gradient Step() was last given, from whole tensors.
  absl::StatusOr<optimizers::GradStats> LocalGradStats() const { return opt_->LocalGradStats(); }

 private:
  SimulatedRanks(const Model& model, int world, int micro)
      : model_(model), world_(world), micro_(micro), params_(MakeParams(model)) {}

  const Model& model_;
  const int world_, micro_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;  // what the optimizer reads
  std::unique_ptr<optimizers::ChainedOptimizer> opt_;
};

// Plain single-process training on the whole global batch: the params after kSteps steps.
absl::StatusOr<std::vector<at::Tensor>> SingleProcess(const Model& model) {
  std::vector<at::Tensor> params = MakeParams(model);
  std::vector<at::Tensor> grads;
  std::vector<optimizers::Param> opt_params;
  for (size_t i = 0; i < params.size(); ++i) {
    grads.push_back(at::zeros(model.specs[i].shape, at::kFloat));
    opt_params.push_back({model.specs[i].name, params[i], grads[i], {}});
  }
  ASSIGN_OR_RETURN(auto opt, optimizers::ChainedOptimizer::Create(std::move(opt_params), Config()));
  for (int step = 0; step < kSteps; ++step) {
    for (at::Tensor& p : params) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    Loss(model, params, Inputs(step), Targets(step), kGlobalBatch, nullptr).backward();
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) grads[i].copy_(params[i].grad());
    RETURN_IF_ERROR(opt->Step().status());
  }
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(p.detach().clone());
  return out;
}

struct RunConfig {
  DistributedMode mode = DistributedMode::kSharded;
  // Sharded residency (ZeRO-3, mode kSharded): each rank keeps only its shards; params are
  // gathered per layer for forward and backward.
  bool shard_params = false;
  bool overlap_grad = false;
  bool overlap_param = false;  // full residency: overlap_param_gather
  bool reshard = true;         // sharded residency: reshard_after_forward
  int micro = 1;
  bool clip = true;  // Config(clip)
  std::string Name() const {
    const char* clipped = clip ? "" : "_noclip";
    if (shard_params) {
      return absl::StrCat("fsdp_grad", overlap_grad ? "On" : "Off", "_reshard",
                          reshard ? "On" : "Off", "_micro", micro, clipped);
    }
    return absl::StrCat(mode == DistributedMode::kSharded ? "sharded" : "replicated", "_grad",
                        overlap_grad ? "On" : "Off", "_param", overlap_param ? "On" : "Off",
                        "_micro", micro, clipped);
  }
};

// Every param as the ranks' shards of the param buffers (`params`) or of the grad buffers hold it,
// all-gathered into scratch memory (the buffers are left as they are). After FinishGradSync the
// grad shards hold the mean gradient; in replicated mode every rank already holds it whole and the
// gather is a copy. With sharded residency the param shards are the only copy of the params
// between uses.
absl::StatusOr<std::vector<at::Tensor>> GatherShards(const Model& model, Communicator& comm,
                                                     ddp::DistributedDataParallel& ddp,
                                                     bool params) {
  std::vector<at::Tensor> out(model.specs.size());
  std::vector<at::Tensor> scratch;
  std::vector<collectives::CollectiveOp> ops;
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    buffers::ParamAndGradBuffer& buf = ddp.buffer(b);
    scratch.push_back(at::zeros({buf.layout().numel()}, at::kFloat));
    for (int k = 0; k < buf.num_buckets(); ++k) {
      collectives::AllGatherOptions options;
      for (int r = 0; r < comm.size(); ++r) {
        const auto [s, e] = buf.layout().ShardRange(k, r);
        options.shard_sizes.push_back(e - s);
      }
      const layout::Bucket& bucket = buf.layout().buckets[k];
      ops.push_back(collectives::AllGatherOp{
          params ? buf.ParamShard(k, comm.rank()) : buf.GradShard(k, comm.rank()),
          scratch.back().narrow(0, bucket.start, bucket.end - bucket.start), std::move(options)});
    }
  }
  ASSIGN_OR_RETURN(auto work, comm.LaunchGroup(std::move(ops)));
  RETURN_IF_ERROR(work->Wait(comm.timeout()));
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    for (const layout::ParamPlacement& p : ddp.buffer(b).layout().params) {
      out[p.param_index] =
          scratch[b].narrow(0, p.start, p.numel()).view(model.specs[p.param_index].shape);
    }
  }
  return out;
}

// Sharded residency between steps: no full bucket is held (every param's and `.grad`'s storage is
// empty) and the persistent bytes are this rank's shards.
absl::Status CheckNothingGathered(const Model& model, const ddp::DistributedDataParallel& ddp,
                                  const std::vector<at::Tensor>& params, const std::string& where) {
  const ddp::DdpMemory memory = ddp.memory();
  int64_t shard_bytes = 0;
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    for (const layout::Bucket& bucket : ddp.buffer(b).layout().buckets) {
      shard_bytes += bucket.shard_size * (4 + 4);  // fp32 params and grads
    }
  }
  if (memory.transient_bytes != 0 || memory.param_bytes + memory.grad_bytes != shard_bytes) {
    return absl::InternalError(absl::StrCat(
        where, ": ", memory.transient_bytes, " transient bytes and ",
        memory.param_bytes + memory.grad_bytes, " persistent, expected 0 and ", shard_bytes));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].storage().nbytes() != 0 || params[i].grad().storage().nbytes() != 0) {
      return absl::InternalError(absl::StrCat(where, ": param '", model.specs[i].name,
                                              "' or its gradient holds full-size storage"));
    }
  }
  return absl::OkStatus();
}

// (A): the distributed mean gradient against the simulated ranks', elementwise within
// 2 gamma(N - 1) sum_r |x_r| (bitwise at N <= 2). Returns the largest |difference|.
absl::StatusOr<double> CheckGradient(const Model& model, int world,
                                     const std::vector<at::Tensor>& got,
                                     const SimulatedRanks::MeanGradient& want,
                                     const std::string& what) {
  const double bound_factor = world <= 2 ? 0.0 : 2.0 * Gamma(world - 1);
  double max_diff = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const at::Tensor diff = got[i].sub(want.mean[i]).abs();
    max_diff = std::max(max_diff, diff.max().item<double>());
    const bool ok = world <= 2 ? at::equal(got[i], want.mean[i])
                               : diff.le(want.abs_sum[i].mul(bound_factor)).all().item<bool>();
    if (!ok) {
      return absl::InternalError(absl::StrCat(
          what, ": mean gradient of '", model.specs[i].name, "' max |diff| ",
          diff.max().item<double>(), " from the simulated ranks', ",
          world <= 2 ? "expected bitwise equality (a sum of two addends has one rounding)"
                     : absl::StrCat("over the bound 2 gamma(", world - 1, ") sum_r |x_r| (up to ",
                                    want.abs_sum[i].max().item<double>() * bound_factor, ")")));
    }
  }
  return max_diff;
}

// (S): the global sum of squares the ranks agreed on against the reference's from the same
// gradient, within 2.1 (gamma(n) + 2u) relative, n the largest param's numel.
absl::Status CheckStats(const Model& model, const optimizers::GradStats& got,
                        const optimizers::GradStats& want, const std::string& what) {
  int64_t n = 0;
  for (const ParamSpec& spec : model.specs) n = std::max(n, spec.numel());
  const double relative = 2.1 * (Gamma(static_cast<int>(n)) + std::ldexp(2.0, -24));
  for (const auto& [name, a, b] : {std::tuple<const char*, double, double>{
                                       "AdamW", got.adamw_sum_squares, want.adamw_sum_squares},
                                   {"Muon", got.muon_sum_squares, want.muon_sum_squares}}) {
    if (!(std::abs(a - b) <= relative * b)) {
      return absl::InternalError(absl::StrCat(what, ": global ", name, " sum of squares ", a,
                                              ", reference ", b, " (relative bound ", relative,
                                              ")"));
    }
  }
  return absl::OkStatus();
}

// Max |a - b| over all params; bitwise equality required.
absl::Status ExpectBitwise(const Model& model, const std::vector<at::Tensor>& got,
                           const std::vector<at::Tensor>& want, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!at::equal(got[i], want[i])) {
      return absl::InternalError(absl::StrCat(what, ": param '", model.specs[i].name,
                                              "' max |diff| ",
                                              got[i].sub(want[i]).abs().max().item<double>(),
                                              ", expected bitwise equality"));
    }
  }
  return absl::OkStatus();
}

std::vector<at::Tensor> Detached(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(p.detach().clone());
  return out;
}

struct TrainResult {
  std::vector<at::Tensor> params;  // after the last param sync
  double max_grad_diff = 0.0;      // largest |distributed - simulated| mean gradient element
  int clipped_steps = 0;           // steps whose clip scale was below 1
};

// Trains kSteps steps through DDP and the distributed chained optimizer, checking (A), (B) and (S)
// against `sim` at every step.
absl::StatusOr<TrainResult> Train(const Model& model, const RunConfig& rc, Communicator& comm,
                                  SimulatedRanks& sim) {
  const int dp = comm.size(), rank = comm.rank();
  layout::LayoutOptions lo;
  lo.dp = dp;
  lo.bucket_size = 64;  // several buckets per buffer
  lo.muon_strategy = layout::Strategy::kLayerwise;  // Adam buffers are always distopt
  ASSIGN_OR_RETURN(layout::FullParamLayout plan, layout::ComputeFullParamLayout(model.specs, lo));
  std::vector<at::Tensor> params = MakeParams(model);
  ddp::DdpConfig dc;
  dc.overlap_grad_reduce = rc.overlap_grad;
  dc.overlap_param_gather = rc.overlap_param;
  if (rc.shard_params) {
    dc.residency = buffers::Residency::kSharded;
    dc.reshard_after_forward = rc.reshard;
  }
  // Replicated optimizers need the whole mean gradient on every rank, and update every param.
  dc.grad_sync = rc.mode == DistributedMode::kSharded ? buffers::GradSync::kReduceScatter
                                                      : buffers::GradSync::kAllReduce;
  dc.timeout = absl::Seconds(120);
  // Counts what DDP overlapped: reduce-scatters launched before backward ended (last micro-batch)
  // and all-gathers waited on by the pre-forward hook of a layer; and the all-gathers the
  // optimizer's step launched (its param sync).
  int grad_launches_in_backward = 0, gathers_waited_by_hook = 0, gathers_launched_in_step = 0;
  bool backward_ended = false, in_step = false;
  dc.on_event = [&](const ddp::SyncEvent& e) {
    using Kind = ddp::SyncEvent::Kind;
    if (e.kind == Kind::kBackwardEnded) backward_ended = true;
    if (e.kind == Kind::kGradReduceLaunched && !backward_ended) ++grad_launches_in_backward;
    if (e.kind == Kind::kParamGatherWaited && e.layer >= 0) ++gathers_waited_by_hook;
    if (e.kind == Kind::kParamGatherLaunched && in_step) ++gathers_launched_in_step;
  };
  ASSIGN_OR_RETURN(auto ddp, ddp::DistributedDataParallel::Create(plan, params, &comm, nullptr, dc));
  ASSIGN_OR_RETURN(const ddp::LayerHooks hooks, ddp->MakeLayerHooks(model.layers));
  std::vector<buffers::ParamAndGradBuffer*> buffers;
  for (int b = 0; b < ddp->num_buffers(); ++b) buffers.push_back(&ddp->buffer(b));
  // The optimizer's step runs the param sync over DDP's bucket groups.
  ASSIGN_OR_RETURN(auto opt, CreateDistributedOptimizer(buffers, &comm, Config(rc.clip), rc.mode,
                                                        {}, &ddp->bucket_groups()));
  int groups = 0;
  for (const auto& order : ddp->GradReduceOrder()) groups += static_cast<int>(order.size());

  TrainResult result;
  const int64_t slice = kGlobalBatch / dp, micro_rows = slice / rc.micro;
  for (int step = 0; step < kSteps; ++step) {
    const std::string where = absl::StrCat(rc.Name(), " step ", step);
    const at::Tensor x = Inputs(step), y = Targets(step);
    ddp->ZeroGradBuffers();
    backward_ended = false;
    for (int m = 0; m < rc.micro; ++m) {
      ddp->set_is_last_microbatch(m == rc.micro - 1);
      const int64_t start = rank * slice + m * micro_rows;
      Loss(model, params, x.narrow(0, start, micro_rows), y.narrow(0, start, micro_rows), slice,
           &hooks)
          .backward();
    }
    RETURN_IF_ERROR(ddp->FinishGradSync());
    // (B) of the previous step: the params this forward used (every gather waited on by now; with
    // sharded residency the shards they were gathered from).
    if (rc.shard_params) {
      ASSIGN_OR_RETURN(const std::vector<at::Tensor> gathered,
                       GatherShards(model, comm, *ddp, /*params=*/true));
      RETURN_IF_ERROR(ExpectBitwise(model, gathered, sim.params(),
                                    where + ": gathered param shards vs the reference's"));
      RETURN_IF_ERROR(CheckNothingGathered(model, *ddp, params, where + " after backward"));
    } else {
      RETURN_IF_ERROR(ExpectBitwise(model, Detached(params), sim.params(),
                                    where + ": params vs the reference's"));
    }
    // (A) at those params.
    ASSIGN_OR_RETURN(const std::vector<at::Tensor> mean,
                     GatherShards(model, comm, *ddp, /*params=*/false));
    ASSIGN_OR_RETURN(const double grad_diff,
                     CheckGradient(model, dp, mean, sim.Gradient(step), where));
    result.max_grad_diff = std::max(result.max_grad_diff, grad_diff);
    {
      c10::NoGradGuard no_grad;
      in_step = true;
      gathers_launched_in_step = 0;
      ASSIGN_OR_RETURN(optimizers::StepResult stepped, opt->Step());
      in_step = false;
      if (stepped.skipped) return absl::InternalError(where + ": skipped");
      // Full residency, sharded optimizer: the step launched every group's all-gather (as each
      // stage was written with overlap_param_gather, all at its end without); else none.
      const int want = rc.mode == DistributedMode::kSharded && !rc.shard_params ? groups : 0;
      if (gathers_launched_in_step != want) {
        return absl::InternalError(absl::StrCat(where, ": the step launched ",
                                                gathers_launched_in_step,
                                                " param all-gathers, expected ", want));
      }
      result.clipped_steps += stepped.clip_scale < 1.0;
      ASSIGN_OR_RETURN(optimizers::StepResult reference, sim.Step(mean, stepped.stats));
      if (reference.clip_scale != stepped.clip_scale ||
          reference.lr_multiplier != stepped.lr_multiplier) {
        return absl::InternalError(absl::StrCat(where, ": clip scale ", stepped.clip_scale,
                                                " and lr multiplier ", stepped.lr_multiplier,
                                                ", reference ", reference.clip_scale, " and ",
                                                reference.lr_multiplier));
      }
      ASSIGN_OR_RETURN(const optimizers::GradStats own, sim.LocalGradStats());
      RETURN_IF_ERROR(CheckStats(model, stepped.stats, own, where));
    }
    // Sharded: only this rank's shards were new; the step started their all-gathers (waited per
    // layer by the next forward's hook with overlap_param_gather). Replicated: nothing to gather.
  }
  RETURN_IF_ERROR(ddp->FinishParamSync());
  if (rc.shard_params) {
    RETURN_IF_ERROR(CheckNothingGathered(model, *ddp, params, rc.Name() + " after the last step"));
    ASSIGN_OR_RETURN(result.params, GatherShards(model, comm, *ddp, /*params=*/true));
  } else {
    result.params = Detached(params);
  }
  RETURN_IF_ERROR(ExpectBitwise(model, result.params, sim.params(),
                                rc.Name() + " after the last step: params vs the reference's"));
  // The overlap paths really ran (every step launches all grad syncs during backward; steps 1..
  // have their gathers waited on by the hooks), and never without the flag. Replicated runs have
  // no param sync to overlap; sharded residency gathers in the hooks always.
  const bool gathers_expected =
      rc.shard_params || (rc.overlap_param && rc.mode == DistributedMode::kSharded);
  if ((grad_launches_in_backward > 0) != rc.overlap_grad ||
      (gathers_waited_by_hook > 0) != gathers_expected) {
    return absl::InternalError(absl::StrCat(rc.Name(), ": ", grad_launches_in_backward,
                                            " grad syncs launched during backward, ",
                                            gathers_waited_by_hook,
                                            " all-gathers waited on by the pre-forward hook"));
  }
  if (rc.mode == DistributedMode::kSharded) {
    // Layer-wise ownership: every Muon matrix owned by exactly one rank (ranks beyond the number
    // of matrices own none).
    int64_t muon = 0;
    for (const ParamSpec& spec : model.specs) muon += spec.role == ParamRole::kMuon;
    at::Tensor owned = at::zeros({1}, at::kLong).fill_(opt->muon().num_slots());
    ASSIGN_OR_RETURN(auto work, comm.AllReduce(owned));
    RETURN_IF_ERROR(work->Wait(comm.timeout()));
    if (owned.item<int64_t>() != muon) {
      return absl::InternalError(absl::StrCat(rc.Name(), ": ", owned.item<int64_t>(),
                                              " Muon matrices owned over all ranks, expected ",
                                              muon));
    }
    if (opt->muon().num_slots() > (muon + dp - 1) / dp + 1) {
      return absl::InternalError(absl::StrCat(rc.Name(), ": rank ", rank, " owns ",
                                              opt->muon().num_slots(), " of ", muon,
                                              " Muon matrices"));
    }
  }
  return result;
}

at::Tensor Flat(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : params) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

// Rank 0's params, broadcast, equal this rank's bitwise.
absl::Status CheckSameOnAllRanks(Communicator& comm, const std::vector<at::Tensor>& params,
                                 const std::string& what) {
  at::Tensor mine = Flat(params);
  at::Tensor root = mine.clone();
  ASSIGN_OR_RETURN(auto work, comm.Broadcast(root));
  RETURN_IF_ERROR(work->Wait(comm.timeout()));
  if (!at::equal(root, mine)) {
    return absl::InternalError(absl::StrCat(what, ": params on rank ", comm.rank(),
                                            " differ from rank 0's (max |diff| ",
                                            root.sub(mine).abs().max().item<double>(), ")"));
  }
  return absl::OkStatus();
}

// Clipping off, the three modes (no overlap) at `micro` micro-batches end at bitwise the same
// params at every N, not only within the bound of (A): replicated's grad all-reduce is the
// sharded modes' reduce-scatter over the same layout followed by an all-gather, so every element
// of the mean gradient is summed in the same order (buffers/bucket_sync.h). With clipping the
// global norm is summed over shards in another order than over whole tensors, so the clip factor,
// and then the params, may differ in their last bits. Returns how many configurations ran.
absl::StatusOr<int> UnclippedModesAgree(const Model& model, const std::string& model_name,
                                        int micro, Communicator& comm) {
  std::vector<at::Tensor> first;
  std::string first_name;
  for (int mode = 0; mode < 3; ++mode) {
    RunConfig rc;
    rc.mode = mode == 1 ? DistributedMode::kReplicated : DistributedMode::kSharded;
    rc.shard_params = mode == 2;
    rc.micro = micro;
    rc.clip = false;
    const std::string name = absl::StrCat(model_name, "/", rc.Name());
    ASSIGN_OR_RETURN(auto sim, SimulatedRanks::Create(model, comm.size(), micro, rc.clip));
    ASSIGN_OR_RETURN(const TrainResult got, Train(model, rc, comm, *sim));
    RETURN_IF_ERROR(CheckSameOnAllRanks(comm, got.params, name));
    if (got.clipped_steps != 0) return absl::InternalError(name + ": clipped with clipping off");
    if (first.empty()) {
      first = got.params;
      first_name = name;
    } else {
      RETURN_IF_ERROR(ExpectBitwise(model, got.params, first, name + " vs " + first_name));
    }
    std::printf("e2e config %s max|grad diff| %.3g, bitwise %s on rank %d\n", name.c_str(),
                got.max_grad_diff, first_name.c_str(), comm.rank());
    std::fflush(stdout);
  }
  return 3;
}

// Every configuration of `model`; returns how many ran.
absl::StatusOr<int> RunModel(const Model& model, const std::string& model_name,
                             Communicator& comm) {
  int configs = 0;
  ASSIGN_OR_RETURN(const std::vector<at::Tensor> single, SingleProcess(model));
  for (int micro : {1, 2}) {
    std::vector<at::Tensor> sharded_base;  // layer-wise, full residency, no overlap
    std::string sharded_base_name;
    // Layer-wise (full residency), replicated, and layer-wise with sharded params (ZeRO-3), which
    // must be bitwise equal to the layer-wise run: the same values computed in the same order.
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<at::Tensor> base;  // this mode and micro count, no overlap
      std::string base_name;
      if (mode == 2) {
        base = sharded_base;
        base_name = sharded_base_name;
      }
      for (int variant = 0; variant < 4; ++variant) {
        RunConfig rc;
        rc.mode = mode == 1 ? DistributedMode::kReplicated : DistributedMode::kSharded;
        rc.shard_params = mode == 2;
        rc.micro = micro;
        rc.overlap_grad = variant & 1;
        rc.overlap_param = !rc.shard_params && (variant & 2);
        rc.reshard = !(variant & 2);
        const std::string name = absl::StrCat(model_name, "/", rc.Name());
        ASSIGN_OR_RETURN(auto sim, SimulatedRanks::Create(model, comm.size(), micro));
        ASSIGN_OR_RETURN(const TrainResult got, Train(model, rc, comm, *sim));
        RETURN_IF_ERROR(CheckSameOnAllRanks(comm, got.params, name));
        // The run trained and clipped: the checks above are not vacuous.
        if (got.clipped_steps == 0) {
          return absl::InternalError(name + ": no step was clipped; clipping is not exercised");
        }
        if (at::equal(Flat(got.params), Flat(MakeParams(model)))) {
          return absl::InternalError(name + ": params never moved");
        }
        // One rank, one micro-batch: plain single-process training, bitwise.
        if (comm.size() == 1 && micro == 1) {
          RETURN_IF_ERROR(ExpectBitwise(model, got.params, single, name + " vs single-process"));
        }
        if (base.empty()) {
          base = got.params;
          base_name = name;
          if (mode == 0) {
            sharded_base = base;
            sharded_base_name = name;
          }
        } else {
          // Overlap on vs off: bitwise.
          RETURN_IF_ERROR(ExpectBitwise(model, got.params, base, name + " vs " + base_name));
        }
        std::printf("e2e config %s max|grad diff| %.3g (%s), %d of %d steps clipped on rank %d\n",
                    name.c_str(), got.max_grad_diff,
                    comm.size() <= 2 ? "bitwise required" : "bound 2 gamma(N-1) sum|x_r|",
                    got.clipped_steps, kSteps, comm.rank());
        std::fflush(stdout);
        ++configs;
      }
    }
    ASSIGN_OR_RETURN(const int unclipped, UnclippedModesAgree(model, model_name, micro, comm));
    configs += unclipped;
  }
  return configs;
}

class DdpOptimizerEquivalenceTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpOptimizerEquivalenceTest, EveryRankMatchesSingleProcess) {
  collectives::testing::MultiRankOptions options;
  options.collective_timeout = absl::Seconds(120);
  collectives::testing::RunOnRanks(
      GetParam(),
      [](Communicator& comm) {
        at::set_num_threads(1);
        // 4 Muon matrices (one per rank at dp 4), and 2 (dp 3 and 4 exceed them: idle Muon ranks).
        for (const auto& [blocks, name] :
             {std::pair<int, const char*>{2, "model4"}, {1, "model2"}}) {
          ASSERT_OK_AND_ASSIGN(const int configs, RunModel(MakeModel(blocks), name, comm));
          // 3 modes x (4 overlap variants + 1 unclipped) x 2 micro counts
          EXPECT_EQ(configs, 30) << name;
        }
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpOptimizerEquivalenceTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::integration::e2e
