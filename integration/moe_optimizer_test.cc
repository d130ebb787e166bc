// The optimizer side of mixture-of-experts training, on real Gloo ranks (the multi-rank harness):
//
//   ExpertMuonIsTorchOptimMuon  pretrain's own setup (integration/setup.h: mesh, MoE model,
//     layout with expert buffers over expt_dp, DDP, the distributed optimizer) at 2 ranks (ep 2,
//     expt_dp 1) and 4 ranks (ep 2 x expt_dp 2), --dist=layerwise, one real step: every expert
//     matrix a rank owns is updated exactly as single-process torch.optim.Muon updates it from the
//     same param and the same gradient (fc1's gate and up blocks each as its own matrix), bit for
//     bit (testdata/expert_muon_oracle.py, run live on this machine as optimizers/oracle_test.cc
//     does).
//   GradNormCountsEveryParamOnce  CreateDistributedOptimizer over hand-built dense and expert
//     buffers: the global gradient norm is the norm of every param counted once, in the sharded
//     and replicated modes, at dense dp 2 with expert dp 2 (ep 1) and with expert dp 1 (ep 2, each
//     rank other experts). Dense dp 1 with expert dp 2 (a tensor-parallel grid; on this project's
//     mesh, whose expert tp is tp, expt_dp <= dp always) cannot be counted right by statistics
//     summed over the dense group, and is rejected.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/round.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/sin.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "buffers/bucket_sync.h"
#include "collectives/mesh.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/python.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/config/trainer_config.h"
#include "integration/setup.h"
#include "layout/layout.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/ns_schedule.h"

namespace orthoshard::integration {
namespace {

using collectives::Communicator;
using collectives::testing::RunOnRanks;
using collectives::testing::WithTimeouts;
using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kOracle[] = "integration/testdata/expert_muon_oracle.py";

std::string RankFile(int world, int rank) {
  return absl::StrCat(::testing::TempDir(), "/expert_muon_w", world, "_r", rank, ".pt");
}

// One real step of pretrain's setup; writes this rank's owned expert matrices before and after,
// their gradients and the Muon hyperparameters (expert_muon_oracle.py's format) to RankFile.
void StepAndRecordOwnedExperts(Communicator& comm, int ep) {
  at::set_num_threads(1);
  TrainerConfig c;
  c.model = "moe-tiny";
  c.ep = ep;
  c.dist = DistMode::kLayerwise;
  c.global_batch = 8;
  c.steps = 10;
  c.warmup_steps = 1;  // the schedule's factor is 1 at step 1
  c.max_grad_norm = 0;  // no clip scale on the gradient
  c.num_threads = 1;
  ASSERT_OK_AND_ASSIGN(Setup s, Build(c, comm));
  ASSERT_OK_AND_ASSIGN(const optimizers::ChainedConfig oc, OptimizerConfigOf(c));
  // The step, as the trainer's RunStep runs it (the aux losses as ExpertStep adds them).
  s.ddp->ZeroGradBuffers();
  const std::vector<data::MicroBatch> batches = s.train->Next();
  ASSERT_EQ(batches.size(), 1u);
  const data::MicroBatch& b = batches[0];
  s.ddp->set_is_last_microbatch(true);
  auto ids = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).view({b.rows, b.cols});
  };
  ASSERT_OK_AND_ASSIGN(at::Tensor objective, s.model->Loss(ids(b.inputs), ids(b.targets)));
  for (const model::MoeAux& a : s.model->moe_aux()) {
    objective = objective + a.load_balance * 0.01 + a.z_loss * 1e-3;
  }
  objective.backward();
  ASSERT_OK(s.ddp->FinishGradSync());
  ASSERT_OK(s.model->TakeCollectiveError());

  // Muon slots of this rank in the expert buffers: the matrices whose shard it holds (OwnerOf).
  const int expert_rank = s.mesh->expt_dp().rank();
  c10::Dict<std::string, at::Tensor> records;
  std::vector<std::pair<std::string, at::Tensor>> owned;  // name, live param view
  for (buffers::ParamAndGradBuffer* buffer : s.buffers) {
    const layout::PerBufferParamLayout& layout = buffer->layout();
    if (!layout.key.expert) continue;
    for (int i = 0; i < static_cast<int>(layout.params.size()); ++i) {
      const layout::ParamPlacement& p = layout.params[i];
      if (p.role != layout::ParamRole::kMuon || layout.OwnerOf(p) != expert_rank) continue;
      records.insert(p.name + "/before", buffer->ParamView(i).clone());
      records.insert(p.name + "/grad", buffer->GradView(i).clone());
      const int64_t rows = buffer->Param(i).size(0);
      const bool fc1 = absl::EndsWith(p.name, ".fc1.weight");
      records.insert(p.name + "/blocks", fc1 ? at::tensor({rows / 2, rows / 2}, at::kLong)
                                             : at::tensor({rows}, at::kLong));
      owned.emplace_back(p.name, buffer->ParamView(i));
    }
  }
  // ep 2: the 16 experts x 2 matrices of this ep rank, split over expt_dp.
  EXPECT_EQ(static_cast<int>(owned.size()) * s.mesh->expt_dp().size(), 4 * 4 * 2);
  at::NoGradGuard no_grad;
  ASSERT_OK_AND_ASSIGN(const optimizers::StepResult result, s.optimizer->Step());
  ASSERT_OK(s.ddp->FinishParamSync());
  ASSERT_FALSE(result.skipped);
  ASSERT_EQ(result.clip_scale, 1.0);
  for (const auto& [name, param] : owned) records.insert(name + "/after", param.clone());
  const optimizers::MuonHyper& m = oc.muon;
  ASSERT_EQ(m.ns.coefficients.size(), 1u) << "one (a, b, c) for every iteration";
  ASSERT_EQ(m.ns.norm_scale, 1.0);  // torch.optim.Muon's normalisation
  ASSERT_EQ(m.ns.dtype, optimizers::NsDType::kBFloat16);  // as torch.optim.Muon's iteration
  ASSERT_EQ(m.scale_rule, optimizers::MuonScaleRule::kOriginal);
  const optimizers::NsCoefficients& abc = m.ns.coefficients[0];
  records.insert("hyper", at::tensor({m.lr * result.lr_multiplier, m.weight_decay, m.momentum,
                                      m.nesterov ? 1.0 : 0.0, m.ns.eps,
                                      static_cast<double>(m.ns.ns_steps), abc[0], abc[1], abc[2]},
                                     at::kDouble));
  const std::vector<char> bytes = torch::jit::pickle_save(records);
  std::ofstream(RankFile(comm.size(), comm.rank()), std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(MoeOptimizer, ExpertMuonIsTorchOptimMuon) {
  for (const int world : {2, 4}) {
    RunOnRanks(
        world, [](Communicator& comm) { StepAndRecordOwnedExperts(comm, /*ep=*/2); },
        WithTimeouts(absl::Seconds(60), absl::Seconds(240)));
  }
  if (collectives::testing::InRankProcess()) return;
  std::vector<std::string> files;
  for (const int world : {2, 4}) {
    for (int r = 0; r < world; ++r) files.push_back(RankFile(world, r));
  }
  ASSERT_OK_AND_ASSIGN(const std::string python, orthoshard::testing::ProjectPython(kOracle));
  const orthoshard::testing::CommandResult run =
      orthoshard::testing::RunPython(python, kOracle, files);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::printf("%s", run.output.c_str());
}


// ---- gradient statistics over dense and expert buffers ----------------------------------------

// A small MoE-shaped model: dense Muon matrices and a norm, and 4 experts of one Muon matrix each;
// with ep 2 rank r holds experts 2r and 2r + 1. Global param index: dense 0..2, expert e at 3 + e.
struct StatsModel {
  std::vector<layout::ParamSpec> specs;
  std::vector<int> global_index;  // per spec
  layout::FullParamLayout layout;
  std::vector<at::Tensor> params;
  std::vector<std::unique_ptr<buffers::ParamAndGradBuffer>> owned;
  std::vector<buffers::ParamAndGradBuffer*> buffers;
};

constexpr int kExperts = 4;

std::vector<layout::ParamSpec> WholeSpecs() {
  std::vector<layout::ParamSpec> specs = {
      {"dense.0.weight", {16, 8}, DType::kFloat32, layout::ParamRole::kMuon},
      {"dense.1.weight", {8, 8}, DType::kFloat32, layout::ParamRole::kMuon},
      {"dense.norm.weight", {8}, DType::kFloat32, layout::ParamRole::kAdam}};
  for (int e = 0; e < kExperts; ++e) {
    specs.push_back({absl::StrCat("experts.", e, ".weight"), {8, 8}, DType::kFloat32,
                     layout::ParamRole::kMuon, /*expert=*/true});
  }
  return specs;
}

// Param `index`'s gradient: multiples of 2^-6 in [-1, 1], so that every sum of squares over a
// slice (at most 128 such squares, multiples of 2^-12 below 2^7) is exact in fp32.
at::Tensor GradOf(const layout::ParamSpec& spec, int index) {
  const at::Tensor wave =
      at::sin(at::arange(spec.numel(), at::kFloat).mul(0.37).add(1.3 * index)).mul(64.0);
  return at::round(wave).div(64.0).view(spec.shape);
}

// The norm of every param's gradient counted once, in double.
double WholeGradNorm() {
  const std::vector<layout::ParamSpec> specs = WholeSpecs();
  double sum = 0;
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    sum += GradOf(specs[i], i).to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

// This rank's part of the model (dense params, and experts [first, first + count)) laid out over
// `dp` dense and `expert_dp` expert ranks, gradients written.
absl::StatusOr<StatsModel> BuildStatsModel(int dp, int expert_dp, int first, int count) {
  StatsModel m;
  const std::vector<layout::ParamSpec> whole = WholeSpecs();
  for (int i = 0; i < static_cast<int>(whole.size()); ++i) {
    const int expert = i - 3;
    if (expert >= 0 && (expert < first || expert >= first + count)) continue;
    m.specs.push_back(whole[i]);
    m.global_index.push_back(i);
    m.params.push_back(at::zeros(whole[i].shape, at::kFloat));
  }
  layout::LayoutOptions options;
  options.dp = dp;
  options.expert_dp = expert_dp;
  options.bucket_size = 64;
  ASSIGN_OR_RETURN(m.layout, layout::ComputeFullParamLayout(m.specs, options));
  for (const layout::PerBufferParamLayout& b : m.layout.buffers) {
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(b, m.params));
    for (int i = 0; i < static_cast<int>(b.params.size()); ++i) {
      const int local = b.params[i].param_index;
      buffer->GradView(i).copy_(GradOf(m.specs[local], m.global_index[local]));
    }
    m.buffers.push_back(buffer.get());
    m.owned.push_back(std::move(buffer));
  }
  return m;
}

// Synchronises the gradients (every rank holds the same values, so the mean is exact) and returns
// the grad norm the distributed optimizer reports for one step.
absl::StatusOr<double> StepGradNorm(StatsModel& m, Communicator& dense, Communicator& experts,
                                    optimizers::distributed::DistributedMode mode) {
  const buffers::GradSync sync = mode == optimizers::distributed::DistributedMode::kSharded
                                     ? buffers::GradSync::kReduceScatter
                                     : buffers::GradSync::kAllReduce;
  for (const bool expert : {false, true}) {
    std::vector<buffers::ParamAndGradBuffer*> group;
    for (buffers::ParamAndGradBuffer* b : m.buffers) {
      if (b->layout().key.expert == expert) group.push_back(b);
    }
    Communicator& comm = expert ? experts : dense;
    ASSIGN_OR_RETURN(auto works,
                     buffers::LaunchGradSync(comm, group, sync, collectives::ReduceOp::kAvg));
    RETURN_IF_ERROR(buffers::WaitAll(works, comm.timeout()));
  }
  optimizers::ChainedConfig config;
  config.max_grad_norm = 0;  // report the norm, clip nothing
  ASSIGN_OR_RETURN(std::unique_ptr<optimizers::ChainedOptimizer> opt,
                   optimizers::distributed::CreateDistributedOptimizer(
                       m.buffers, &dense, config, mode, {}, nullptr, &experts));
  at::NoGradGuard no_grad;
  ASSIGN_OR_RETURN(const optimizers::StepResult result, opt->Step());
  return result.grad_norm;
}

// The grad norm counts every param once at dense dp 2 with expert dp 2 (ep 1: every rank holds
// every expert, sharded over both) and with expert dp 1 (ep 2: each rank holds other experts
// whole), sharded and replicated: each slot's sum of squares is exact (GradOf), rounded once by
// an fp32 square root and squared back in double, so the norm is within 2^-22 (relative) of the
// exact one. Counting the experts once per rank would give sqrt(dense^2 + 2 experts^2); missing
// the other rank's experts or shards sqrt(dense^2 + experts^2 / 2).
TEST(MoeOptimizer, GradNormCountsEveryParamOnce) {
  RunOnRanks(
      2,
      [](Communicator& world) {
        at::set_num_threads(1);
        const double want = WholeGradNorm();
        for (const int ep : {1, 2}) {
          collectives::MeshGrid grid = collectives::DataParallelGrid(2);
          grid.ep = ep;
          ASSERT_OK_AND_ASSIGN(collectives::Mesh mesh, collectives::Mesh::Create(world, grid));
          for (const auto mode : {optimizers::distributed::DistributedMode::kSharded,
                                  optimizers::distributed::DistributedMode::kReplicated}) {
            const int held = kExperts / ep;
            ASSERT_OK_AND_ASSIGN(StatsModel m, BuildStatsModel(mesh.dp().size(),
                                                               mesh.expt_dp().size(),
                                                               mesh.coordinates().ep * held, held));
            ASSERT_OK_AND_ASSIGN(const double norm,
                                 StepGradNorm(m, mesh.dp(), mesh.expt_dp(), mode));
            EXPECT_NEAR(norm, want, 0x1p-22 * want)
                << "ep " << ep << ", expt_dp " << mesh.expt_dp().size() << ", "
                << (mode == optimizers::distributed::DistributedMode::kSharded ? "sharded"
                                                                               : "replicated");
          }
        }
        // Dense dp 1, expert dp 2: the dense group of one rank (a tp 2 grid's dp groups) and the
        // experts sharded over both ranks. Statistics summed over the dense group cannot see the
        // other rank's expert shards.
        collectives::MeshGrid tp2;
        tp2.tp = 2;
        ASSERT_OK_AND_ASSIGN(collectives::Mesh mesh, collectives::Mesh::Create(world, tp2));
        ASSERT_EQ(mesh.dp().size(), 1);
        ASSERT_OK_AND_ASSIGN(StatsModel m, BuildStatsModel(1, 2, 0, kExperts));
        const absl::StatusOr<double> norm = StepGradNorm(
            m, mesh.dp(), world, optimizers::distributed::DistributedMode::kSharded);
        std::printf("dense dp 1 / expert dp 2 on rank %d: %s (whole norm %.9g)\n", world.rank(),
                    norm.ok() ? absl::StrCat("grad norm ", *norm).c_str()
                              : norm.status().ToString().c_str(),
                    want);
        EXPECT_THAT(norm.status(),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("expert buffers are sharded over 2 ranks")));
      },
      WithTimeouts(absl::Seconds(60), absl::Seconds(180)));
}

}  // namespace
}  // namespace orthoshard::integration
