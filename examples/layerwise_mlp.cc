// A complete data-parallel training program that uses orthoshard as a library: a custom LibTorch
// model (a residual MLP classifier written with at:: ops), trained with the layer-wise distributed
// optimizer (Muon on each hidden matrix, owned whole by one rank; ZeRO-1 AdamW for the rest) over
// DDP's bucketed reduce-scatter / all-gather on Gloo.
//
//   bazel run //examples:layerwise_mlp                 # starts 2 local ranks itself
//   bazel run //examples:layerwise_mlp -- --nproc=3
//   torchrun --no-python --nproc-per-node=2 bazel-bin/examples/layerwise_mlp
//
// The steps a training loop must follow (see ddp/distributed_data_parallel.h):
//   plan a layout -> wrap params in DDP -> create the optimizer over DDP's buffers and bucket
//   groups -> per step: ZeroGradBuffers, forward (calling DDP's pre-forward hook per layer) +
//   backward, FinishGradSync, optimizer Step (which starts the param sync); FinishParamSync before
//   reading params outside a forward.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/gloo_communicator.h"
#include "collectives/launch/launcher.h"
#include "collectives/rendezvous.h"
#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"
#include "layout/layout.h"
#include "optimizers/chained.h"
#include "optimizers/distributed/distributed_optimizer.h"

ABSL_FLAG(int, nproc, 2, "Ranks to start when not already under a launcher (torchrun, SLURM).");
ABSL_FLAG(int, steps, 60, "Training steps.");
ABSL_FLAG(int, hidden, 64, "Hidden width of the MLP.");
ABSL_FLAG(int, blocks, 3, "Residual blocks (each: two Muon matrices).");

namespace {

using orthoshard::DType;
using orthoshard::layout::ParamRole;
using orthoshard::layout::ParamSpec;

constexpr int64_t kFeatures = 16, kClasses = 4, kGlobalBatch = 128;

// The custom model: a description of its params (what the layout planner needs), the params
// themselves, and a forward that calls `enter(layer)` before each layer reads its params.
struct Mlp {
  std::vector<ParamSpec> specs;
  std::vector<int> layer_of_param;
  std::vector<at::Tensor> params;
  int blocks = 0;

  void Add(std::string name, std::vector<int64_t> shape, ParamRole role, int layer, double scale) {
    ParamSpec spec;
    spec.name = std::move(name);
    spec.shape = shape;
    spec.dtype = DType::kFloat32;
    spec.role = role;
    specs.push_back(spec);
    layer_of_param.push_back(layer);
    at::Tensor init = shape.size() == 1 ? at::zeros(shape) : at::randn(shape).mul(scale);
    params.push_back(init.set_requires_grad(true));
  }

  // Logits [B, kClasses] for inputs [B, kFeatures].
  at::Tensor Forward(const at::Tensor& x, const std::function<void(int)>& enter) const {
    enter(0);
    at::Tensor h = x.mm(params[0].t()).add(params[1]);
    for (int b = 0; b < blocks; ++b) {
      enter(1 + b);
      const int i = 2 + 3 * b;
      h = h.add(h.mm(params[i].t()).relu().mm(params[i + 1].t()).add(params[i + 2]));
    }
    enter(1 + blocks);
    return h.mm(params[params.size() - 1].t());
  }
};

Mlp MakeMlp(int hidden, int blocks) {
  Mlp m;
  m.blocks = blocks;
  // The optimizer routes by its own rules (2-D and not embedding/output/norm/bias -> Muon); the
  // layout roles must agree, or the optimizer refuses the buffers.
  m.Add("input.weight", {hidden, kFeatures}, ParamRole::kMuon, 0, 1.0 / std::sqrt(kFeatures));
  m.Add("input.bias", {hidden}, ParamRole::kAdam, 0, 0);
  for (int b = 0; b < blocks; ++b) {
    const std::string p = absl::StrCat("blocks.", b, ".");
    m.Add(p + "up.weight", {2 * hidden, hidden}, ParamRole::kMuon, 1 + b, 1.0 / std::sqrt(hidden));
    m.Add(p + "down.weight", {hidden, 2 * hidden}, ParamRole::kMuon, 1 + b, 0.5 / std::sqrt(hidden));
    m.Add(p + "down.bias", {hidden}, ParamRole::kAdam, 1 + b, 0);
  }
  m.Add("output_layer.weight", {kClasses, hidden}, ParamRole::kAdam, 1 + blocks, 0.1);
  return m;
}

// A learnable synthetic task: the class is the quadrant of two fixed projections of a Gaussian
// input. Every rank draws the same global batch (seeded by the step) and takes its slice.
void Batch(int step, at::Tensor* x, at::Tensor* y) {
  at::manual_seed(1000 + step);
  *x = at::randn({kGlobalBatch, kFeatures});
  at::Tensor a = x->narrow(1, 0, 8).sum(1), b = x->narrow(1, 8, 8).sum(1);
  *y = a.gt(0).to(at::kLong).mul(2).add(b.gt(0).to(at::kLong));
}

absl::Status Train(orthoshard::collectives::Communicator& comm) {
  namespace ddp = orthoshard::ddp;
  namespace dist = orthoshard::optimizers::distributed;
  at::manual_seed(0);  // same initial params on every rank
  Mlp model = MakeMlp(absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_blocks));

  orthoshard::layout::LayoutOptions layout_options;
  layout_options.dp = comm.size();
  layout_options.bucket_size = 8192;
  ASSIGN_OR_RETURN(auto layout, orthoshard::layout::ComputeFullParamLayout(model.specs, layout_options));

  ddp::DdpConfig ddp_config;
  ddp_config.overlap_grad_reduce = true;
  ddp_config.overlap_param_gather = true;
  ASSIGN_OR_RETURN(auto ddp_model,
                   ddp::DistributedDataParallel::Create(layout, model.params, &comm, nullptr, ddp_config));
  ASSIGN_OR_RETURN(std::function<void(int)> enter, ddp_model->PreForwardHook(model.layer_of_param));

  std::vector<orthoshard::buffers::ParamAndGradBuffer*> buffers;
  for (int b = 0; b < ddp_model->num_buffers(); ++b) buffers.push_back(&ddp_model->buffer(b));
  orthoshard::optimizers::ChainedConfig opt_config;
  opt_config.adamw.lr = 3e-3;
  opt_config.muon.lr = 2e-2;
  opt_config.max_grad_norm = 1.0;
  // Which params Muon updates comes from the layout (ParamSpec::role above).
  // Its Step starts each bucket group's all-gather as soon as this rank's part of it is updated.
  ASSIGN_OR_RETURN(auto optimizer,
                   dist::CreateDistributedOptimizer(buffers, &comm, opt_config,
                                                    dist::DistributedMode::kSharded, {},
                                                    &ddp_model->bucket_groups()));
  if (comm.rank() == 0) {
    std::printf("layerwise_mlp: %d ranks; this rank owns %lld of the Muon matrices\n", comm.size(),
                static_cast<long long>(optimizer->muon().num_slots()));
  }

  const int64_t slice = kGlobalBatch / comm.size();
  double first_loss = 0, loss_value = 0;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int step = 0; step < steps; ++step) {
    at::Tensor x, y;
    Batch(step, &x, &y);
    ddp_model->ZeroGradBuffers();
    at::Tensor loss = at::cross_entropy_loss(
        model.Forward(x.narrow(0, comm.rank() * slice, slice), enter),
        y.narrow(0, comm.rank() * slice, slice));
    loss.backward();
    RETURN_IF_ERROR(ddp_model->FinishGradSync());
    {
      c10::NoGradGuard no_grad;
      RETURN_IF_ERROR(optimizer->Step().status());
    }
    // Mean loss over ranks, for the log line.
    at::Tensor mean = loss.detach().reshape({1}).clone();
    orthoshard::collectives::AllReduceOptions avg;
    avg.op = orthoshard::collectives::ReduceOp::kAvg;
    ASSIGN_OR_RETURN(auto work, comm.AllReduce(mean, avg));
    RETURN_IF_ERROR(work->Wait(comm.timeout()));
    loss_value = mean.item<double>();
    if (step == 0) first_loss = loss_value;
    if (comm.rank() == 0 && (step % 10 == 0 || step == steps - 1)) {
      std::printf("step %3d  loss %.4f\n", step, loss_value);
    }
  }
  RETURN_IF_ERROR(ddp_model->FinishParamSync());
  if (comm.rank() == 0) {
    std::printf("layerwise_mlp: loss %.4f -> %.4f (chance: %.4f)\n", first_loss, loss_value,
                std::log(static_cast<double>(kClasses)));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  namespace collectives = orthoshard::collectives;
  // Not under a launcher: start --nproc ranks of this binary, which then find the variables.
  if (std::optional<int> launched =
          collectives::LaunchSelfUnlessRank(argc, argv, absl::GetFlag(FLAGS_nproc))) {
    return *launched;
  }
  const absl::StatusOr<collectives::RendezvousInfo> rendezvous =
      collectives::ParseRendezvous(collectives::ProcessEnvironment());
  at::set_num_threads(1);  // ranks share this machine's cores
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> comm =
      collectives::CreateGlooCommunicator(collectives::GlooOptionsFromRendezvous(*rendezvous));
  absl::Status status = comm.ok() ? Train(**comm) : comm.status();
  if (!status.ok()) {
    std::fprintf(stderr, "layerwise_mlp: rank %d: %s\n", rendezvous->rank,
                 std::string(status.message()).c_str());
    return 1;
  }
  (void)rest;
  return 0;
}
