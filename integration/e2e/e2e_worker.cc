// One rank of ddp_optimizer_equivalence_test, started by LaunchLocal at 1-4 ranks:
//   e2e_worker
// End-to-end proof that ddp/ and optimizers/distributed/ compose: a small transformer-like model
// built from at:: ops (embedding, residual MLP blocks with RMS norms, an output head) trains for
// kSteps steps on a global batch of kGlobalBatch samples split across ranks (each rank its slice,
// loss = mean over the slice; DDP averages, giving the mean over the global batch). Real backward
// runs through DDP's gradient hooks; the forward calls DDP's pre-forward hook per layer. Each
// configuration -- mode (sharded: layer-wise Muon + ZeRO-1 AdamW; replicated: every rank steps
// everything) x overlap_grad_reduce x overlap_param_gather x micro-batches (1 or 2) -- is checked:
//   * every rank's params are bitwise identical (rank 0's broadcast compared);
//   * they match a single-process ChainedOptimizer run on the whole global batch, computed here,
//     within kTolerance (see below);
//   * overlap variants are bitwise identical to the no-overlap run of the same mode and micro count.
// Sharded and replicated are not compared bitwise: the global grad norm used for clipping sums
// per-rank partial sums of squares in sharded mode and whole tensors in replicated mode, so the
// clip factor can differ in the last bit (seen at 4 ranks: 3e-8 on the embedding); both are held
// to the single-process run instead.
// Prints "e2e config NAME max|diff| X on rank R" per configuration and "e2e worker passed on rank
// R" at the end; exits 1 naming the config, param and difference otherwise.
//
// Tolerance. The distributed gradient is the mean over ranks of per-slice means (DDP pre-scales by
// 1/dp and sums; micro-batches accumulate), the reference is one mean over the whole batch: the
// same real number summed in another order, so fp32 rounding differs (~1e-7 relative). Clipping
// by the global norm and Newton-Schulz propagate that smoothly; AdamW's first step divides by
// sqrt(v) and is sign-like, which stays stable for gradient elements well away from zero. The
// measured max |diff| after 4 steps (printed per configuration) is at most 2.38e-7 over every
// configuration at 1-4 ranks (2 fp32 ulps at |p| ~ 2), and exactly 0 at 1 rank with 1 micro-batch,
// where the op order is the reference's (asserted bitwise). kTolerance = 2e-5 leaves ~80x margin
// and is still ~500x below one AdamW update (lr 1e-2), so a missed sync or a wrong scale fails
// (a skipped param all-gather gives 3e-2).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "collectives/gloo_communicator.h"
#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"
#include "layout/layout.h"
#include "optimizers/chained.h"
#include "optimizers/distributed/distributed_optimizer.h"

namespace orthoshard::integration::e2e {
namespace {

using collectives::Communicator;
using layout::ParamRole;
using layout::ParamSpec;
using optimizers::distributed::DistributedChainedOptimizer;
using optimizers::distributed::DistributedMode;

constexpr int64_t kGlobalBatch = 24;  // divisible by 1..4 ranks x 2 micro-batches
constexpr int64_t kIn = 16, kHidden = 8, kOut = 4;
constexpr int kSteps = 4;
constexpr double kTolerance = 2e-5;

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

// Sum over the rows of x of the squared error, divided by `norm`. `pre_forward(layer)` is called
// right before each layer runs (DDP's pre-forward hook; may be empty).
at::Tensor Loss(const Model& model, const std::vector<at::Tensor>& p, const at::Tensor& x,
                const at::Tensor& y, double norm, const std::function<void(int)>& pre_forward) {
  auto enter = [&](int layer) {
    if (pre_forward) pre_forward(layer);
  };
  enter(0);
  at::Tensor h = x.mm(p[0]);
  for (int b = 0; b < model.blocks; ++b) {
    enter(1 + b);
    const int i = 1 + 4 * b;
    at::Tensor u = RmsNorm(h, p[i]).mm(p[i + 1].t()).add(p[i + 2]).tanh();
    h = h.add(u.mm(p[i + 3].t()));
  }
  enter(1 + model.blocks);
  const int i = 1 + 4 * model.blocks;
  at::Tensor out = RmsNorm(h, p[i]).mm(p[i + 1].t());
  return out.sub(y).pow(2).sum().div(norm);
}

optimizers::ChainedConfig Config() {
  optimizers::ChainedConfig config;
  config.adamw.lr = 1e-2;
  config.adamw.weight_decay = 0.05;
  config.adamw_non_matrix_weight_decay = 0.0;
  config.muon.lr = 2e-2;
  config.muon.weight_decay = 0.1;
  config.max_grad_norm = 1.0;  // clipping by the global norm is exercised
  config.schedule.kind = optimizers::ScheduleKind::kWarmupCosine;
  config.schedule.warmup_steps = 2;
  config.schedule.total_steps = 20;
  return config;
}

// Single-process ChainedOptimizer on the whole global batch: the params after kSteps steps.
absl::StatusOr<std::vector<at::Tensor>> Reference(const Model& model) {
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
    Loss(model, params, Inputs(step), Targets(step), kGlobalBatch, {}).backward();
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
  bool overlap_grad = false;
  bool overlap_param = false;
  int micro = 1;
  std::string Name() const {
    return absl::StrCat(mode == DistributedMode::kSharded ? "sharded" : "replicated",
                        "_grad", overlap_grad ? "On" : "Off", "_param", overlap_param ? "On" : "Off",
                        "_micro", micro);
  }
};

// Replicated mode needs the whole mean gradient on every rank: DDP reduce-scatters each bucket,
// then every rank's shard is all-gathered back (reduce-scatter + all-gather = all-reduce, and every
// rank ends with the same bits).
absl::Status AllGatherGrads(Communicator& comm, ddp::DistributedDataParallel& ddp) {
  std::vector<collectives::CollectiveOp> ops;
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    buffers::ParamAndGradBuffer& buf = ddp.buffer(b);
    for (int k = 0; k < buf.num_buckets(); ++k) {
      collectives::AllGatherOptions options;
      for (int r = 0; r < comm.size(); ++r) {
        const auto [s, e] = buf.layout().ShardRange(k, r);
        options.shard_sizes.push_back(e - s);
      }
      ops.push_back(collectives::AllGatherOp{buf.GradShard(k, comm.rank()), buf.GradBucket(k),
                                             std::move(options)});
    }
  }
  ASSIGN_OR_RETURN(auto work, comm.LaunchGroup(std::move(ops)));
  return work->Wait(comm.timeout());
}

// Trains kSteps steps through DDP and the distributed chained optimizer; returns the final params
// (clones, after the last param sync).
absl::StatusOr<std::vector<at::Tensor>> Train(const Model& model, const RunConfig& rc,
                                              Communicator& comm) {
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
  dc.timeout = absl::Seconds(120);
  // Counts what DDP overlapped: reduce-scatters launched before backward ended (last micro-batch)
  // and all-gathers waited on by the pre-forward hook of a layer.
  int grad_launches_in_backward = 0, gathers_waited_by_hook = 0;
  bool backward_ended = false;
  dc.on_event = [&](const ddp::SyncEvent& e) {
    using Kind = ddp::SyncEvent::Kind;
    if (e.kind == Kind::kBackwardEnded) backward_ended = true;
    if (e.kind == Kind::kGradReduceLaunched && !backward_ended) ++grad_launches_in_backward;
    if (e.kind == Kind::kParamGatherWaited && e.layer >= 0) ++gathers_waited_by_hook;
  };
  ASSIGN_OR_RETURN(auto ddp, ddp::DistributedDataParallel::Create(plan, params, &comm, nullptr, dc));
  ASSIGN_OR_RETURN(std::function<void(int)> hook, ddp->PreForwardHook(model.layers));
  std::vector<buffers::ParamAndGradBuffer*> buffers;
  for (int b = 0; b < ddp->num_buffers(); ++b) buffers.push_back(&ddp->buffer(b));
  ASSIGN_OR_RETURN(auto opt, DistributedChainedOptimizer::Create(buffers, &comm, Config(), rc.mode));

  const int64_t slice = kGlobalBatch / dp, micro_rows = slice / rc.micro;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor x = Inputs(step), y = Targets(step);
    ddp->ZeroGradBuffers();
    backward_ended = false;
    for (int m = 0; m < rc.micro; ++m) {
      ddp->set_is_last_microbatch(m == rc.micro - 1);
      const int64_t start = rank * slice + m * micro_rows;
      Loss(model, params, x.narrow(0, start, micro_rows), y.narrow(0, start, micro_rows), slice,
           hook)
          .backward();
    }
    RETURN_IF_ERROR(ddp->FinishGradSync());
    if (rc.mode == DistributedMode::kReplicated) RETURN_IF_ERROR(AllGatherGrads(comm, *ddp));
    {
      c10::NoGradGuard no_grad;
      ASSIGN_OR_RETURN(optimizers::StepResult result, opt->Step());
      if (result.skipped) return absl::InternalError(absl::StrCat("step ", step, " skipped"));
    }
    // Sharded: only this rank's shards are new; DDP owns the all-gathers (waited per layer by the
    // next forward's hook with overlap_param_gather). Replicated: the gather is a no-op in value.
    RETURN_IF_ERROR(ddp->StartParamSync());
  }
  RETURN_IF_ERROR(ddp->FinishParamSync());
  // The overlap paths really ran (every step launches all reduce-scatters during backward; steps
  // 1.. have their gathers waited on by the hooks), and never without the flag.
  if ((grad_launches_in_backward > 0) != rc.overlap_grad ||
      (gathers_waited_by_hook > 0) != rc.overlap_param) {
    return absl::InternalError(absl::StrCat(rc.Name(), ": ", grad_launches_in_backward,
                                            " reduce-scatters launched during backward, ",
                                            gathers_waited_by_hook,
                                            " all-gathers waited on by the pre-forward hook"));
  }
  if (rc.mode == DistributedMode::kSharded) {
    // Layer-wise ownership: every Muon matrix owned by exactly one rank (ranks beyond the number
    // of matrices own none).
    int64_t muon = 0;
    for (const ParamSpec& spec : model.specs) muon += spec.role == ParamRole::kMuon;
    at::Tensor owned = at::zeros({1}, at::kLong).fill_(
        static_cast<int64_t>(opt->OwnedMuonParams().size()));
    ASSIGN_OR_RETURN(auto work, comm.AllReduce(owned));
    RETURN_IF_ERROR(work->Wait(comm.timeout()));
    if (owned.item<int64_t>() != muon) {
      return absl::InternalError(absl::StrCat(rc.Name(), ": ", owned.item<int64_t>(),
                                              " Muon matrices owned over all ranks, expected ",
                                              muon));
    }
    if (opt->OwnedMuonParams().size() > static_cast<size_t>((muon + dp - 1) / dp) + 1) {
      return absl::InternalError(absl::StrCat(rc.Name(), ": rank ", rank, " owns ",
                                              opt->OwnedMuonParams().size(), " of ", muon,
                                              " Muon matrices"));
    }
  }
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(p.detach().clone());
  return out;
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

// Max |a - b| over all params; with tolerance < 0 requires bitwise equality, else <= tolerance.
absl::StatusOr<double> Compare(const Model& model, const std::vector<at::Tensor>& got,
                               const std::vector<at::Tensor>& want, double tolerance,
                               const std::string& what) {
  double max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = got[i].sub(want[i]).abs().max().item<double>();
    max_diff = std::max(max_diff, diff);
    const bool ok = tolerance < 0 ? at::equal(got[i], want[i]) : diff <= tolerance;
    if (!ok) {
      return absl::InternalError(absl::StrCat(what, ": param '", model.specs[i].name, "' max |diff| ",
                                              diff, tolerance < 0 ? ", expected bitwise equality"
                                                                  : absl::StrCat(" > tolerance ",
                                                                                 tolerance)));
    }
  }
  return max_diff;
}

absl::Status RunModel(const Model& model, const std::string& model_name, Communicator& comm) {
  ASSIGN_OR_RETURN(const std::vector<at::Tensor> reference, Reference(model));
  // The reference moved: the test is not vacuous.
  ASSIGN_OR_RETURN(const double moved, Compare(model, reference, MakeParams(model), 1e30, "init"));
  if (moved < 1e-3) return absl::InternalError(absl::StrCat("reference moved only ", moved));
  for (int micro : {1, 2}) {
    for (DistributedMode mode : {DistributedMode::kSharded, DistributedMode::kReplicated}) {
      std::vector<at::Tensor> base;  // this mode and micro count, no overlap
      std::string base_name;
      for (int variant = 0; variant < 4; ++variant) {
        RunConfig rc;
        rc.mode = mode;
        rc.micro = micro;
        rc.overlap_grad = variant & 1;
        rc.overlap_param = variant & 2;
        const std::string name = absl::StrCat(model_name, "/", rc.Name());
        ASSIGN_OR_RETURN(std::vector<at::Tensor> got, Train(model, rc, comm));
        RETURN_IF_ERROR(CheckSameOnAllRanks(comm, got, name));
        // One rank, one micro-batch: the same ops in the same order as the reference: bitwise.
        const bool exact = comm.size() == 1 && micro == 1;
        ASSIGN_OR_RETURN(const double diff, Compare(model, got, reference, exact ? -1 : kTolerance,
                                                    name + " vs single-process"));
        if (base.empty()) {
          base = got;
          base_name = name;
        } else {
          // Overlap on vs off: bitwise.
          RETURN_IF_ERROR(Compare(model, got, base, -1, name + " vs " + base_name).status());
        }
        std::printf("e2e config %s max|diff| %.3g on rank %d\n", name.c_str(), diff, comm.rank());
        std::fflush(stdout);
      }
    }
  }
  return absl::OkStatus();
}

int Main() {
  at::set_num_threads(1);
  auto comm = collectives::JoinGlooFromEnvironment(absl::Seconds(120), absl::Seconds(120));
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int rank = (*comm)->rank();
  // 4 Muon matrices (one per rank at dp 4), and 2 (dp 3 and 4 exceed them: idle Muon ranks).
  for (const auto& [blocks, name] : {std::pair<int, const char*>{2, "model4"}, {1, "model2"}}) {
    const absl::Status status = RunModel(MakeModel(blocks), name, **comm);
    if (!status.ok()) {
      std::printf("e2e FAILED on rank %d: %s\n", rank, status.ToString().c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
  std::printf("e2e worker passed on rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace orthoshard::integration::e2e

int main() { return orthoshard::integration::e2e::Main(); }
