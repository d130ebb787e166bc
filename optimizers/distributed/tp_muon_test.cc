// Muon for tensor-parallel matrices (MuonTpMode, CreateDistributedOptimizer's
// TensorParallelOptimizer) in real multi-process Gloo jobs: 4 ranks as tp 2 x dp 2 and 2 ranks as
// tp 2 x dp 1, through collectives::Mesh. Each rank builds the buffers of a GPT-like model's
// tp-LOCAL slices (layout + buffers as distributed_optimizer_test does): a fused QKV split by KV
// groups (dim 0, 1 part, FusedSplit of 2 groups of Q, K, V), a SwiGLU fc1 (dim 0, 2 parts: gate and
// up halves, FusedSplit {24, 24}), proj and fc2 (dim 1), replicated norms (AdamW) and a
// vocab-split embedding (AdamW). Gradients: each dp rank's global gradient is RankGrad of the
// global shape (multiples of 2^-6, so dp means are exact in any order), each tp rank takes its
// slice. Four steps, the third with a NaN in one slice of one rank. What each case proves:
//   sharded / replicated (tp 2 x dp 2 and tp 2 x dp 1): owner and duplicated, each on its own copy
//       of the model, give every rank's slices bitwise equal to each other and to the slices of a
//       single-process ChainedOptimizer over the GLOBAL matrices (global FusedSplits) on the mean
//       gradients; the NaN step is skipped on every rank (params unchanged); the agreed grad norm
//       is the single-process one within 2^-22 (derived below) and the zero-gradient count is
//       equal exactly (every element counted once over the tp x dp grid: replicated params on tp
//       rank 0 only).
//   blockwise: every rank's slices bitwise equal to a single-process ChainedOptimizer that treats
//       this tp rank's slices as independent matrices (the slices' FusedSplits), and different
//       from owner's.
//   ns_cost: gpt2-124m's 12 layers of tp-2 local matrices at tp 2 x dp 2: owner's per-rank
//       Newton–Schulz cost (ChainedOptimizer::ns_cost) within 10% of the mean, printed.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/max.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "buffers/bucket_sync.h"
#include "collectives/mesh.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "common/tp_split.h"
#include "gtest/gtest.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"
#include "optimizers/distributed/testing/tp_model.h"
#include "optimizers/tp_muon.h"

namespace orthoshard::optimizers::distributed::testing {
namespace {

using collectives::Communicator;
using collectives::Mesh;
using collectives::MeshGrid;
using collectives::testing::RunOnRanks;

constexpr int kTp = 2;
constexpr int kBucketSize = 300;
constexpr int kSteps = 4;
constexpr int kNanStep = 2;

MeshGrid Grid(int dp) {
  MeshGrid grid;
  grid.tp = kTp;
  grid.dp = dp;
  return grid;
}

at::Tensor Slice(const TpParam& p, int tp_rank, const at::Tensor& global) {
  return SliceOf(p, kTp, tp_rank, global);
}

// Writes this rank's gradients (its dp rank's global RankGrad, sliced), reduces them over dp as DDP
// does, after putting a NaN into the first element of layer 0's qkv slice when `poison`.
absl::Status FillAndReduce(const std::vector<TpParam>& ps, DistributedModel& model, int tp_rank,
                           Communicator& dp, DistributedMode mode, int step, bool poison) {
  FillTpGrads(ps, model, kTp, tp_rank, dp.rank(), step,
              poison ? "layers.0.attn.qkv.weight" : "");
  const buffers::GradSync sync = mode == DistributedMode::kSharded
                                     ? buffers::GradSync::kReduceScatter
                                     : buffers::GradSync::kAllReduce;
  ASSIGN_OR_RETURN(auto works, buffers::LaunchGradSync(dp, model.buffers, sync,
                                                       collectives::ReduceOp::kAvg));
  return buffers::WaitAll(works, dp.timeout());
}

// A single-process ChainedOptimizer over the global matrices (tp_rank < 0) or over tp rank
// tp_rank's slices as independent matrices (their slices' FusedSplits), routed by role.
class TpReference {
 public:
  static absl::StatusOr<std::unique_ptr<TpReference>> Create(const std::vector<TpParam>& ps,
                                                           const ChainedConfig& config,
                                                           int tp_rank) {
    auto ref = std::unique_ptr<TpReference>(new TpReference());
    ref->ps_ = ps;
    ref->tp_rank_ = tp_rank;
    const std::vector<at::Tensor> global = MakeModelParams(GlobalSpecs(ps));
    RoutingReport routing;
    std::vector<Slot> slots;
    std::map<std::string, FusedSplit> splits;
    for (size_t i = 0; i < ps.size(); ++i) {
      at::Tensor param = tp_rank < 0 ? global[i] : Slice(ps[i], tp_rank, global[i]);
      ref->params_.push_back(param);
      ref->grads_.push_back(at::zeros(param.sizes(), at::kFloat));
      const bool muon = ps[i].role == layout::ParamRole::kMuon;
      routing.entries.push_back({ps[i].name, muon ? Route::kMuon : Route::kAdamW, "role",
                                 param.numel()});
      if (muon && !ps[i].split.block_rows.empty()) {
        if (tp_rank < 0) {
          splits[ps[i].name] = ps[i].split;
        } else {
          ASSIGN_OR_RETURN(
              splits[ps[i].name],
              TpLocalFusedSplit(ps[i].split, SplitOf(ps[i], kTp, tp_rank), ps[i].name));
        }
      }
      slots.push_back(Slot::Whole(ps[i].name, param, ref->grads_[i]));
    }
    ASSIGN_OR_RETURN(ref->opt_, ChainedOptimizer::Create(config, routing, std::move(slots), splits,
                                                         nullptr));
    return ref;
  }

  // Every gradient the mean over dp of RankGrad (sliced for a slice reference); a NaN in layer 0's
  // qkv when `poison`.
  absl::StatusOr<StepResult> Step(int dp, int step, bool poison) {
    const std::vector<layout::ParamSpec> global = GlobalSpecs(ps_);
    for (size_t i = 0; i < ps_.size(); ++i) {
      at::Tensor g = MeanGrad(global[i], static_cast<int>(i), dp, step);
      grads_[i].copy_(tp_rank_ < 0 ? g : Slice(ps_[i], tp_rank_, g));
      if (poison && ps_[i].name == "layers.0.attn.qkv.weight") grads_[i].view({-1})[0].fill_(NAN);
    }
    return opt_->Step();
  }
  const std::vector<at::Tensor>& params() const { return params_; }
  ChainedOptimizer& optimizer() { return *opt_; }

 private:
  TpReference() = default;
  std::vector<TpParam> ps_;
  int tp_rank_ = -1;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;
  std::unique_ptr<ChainedOptimizer> opt_;
};

// Every local param bitwise equal to `want` (sliced from global tensors when `want_global`).
absl::Status CompareSlices(const std::vector<TpParam>& ps, int tp_rank,
                           const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                           bool want_global, const std::string& when) {
  for (size_t i = 0; i < ps.size(); ++i) {
    const at::Tensor w = want_global ? Slice(ps[i], tp_rank, want[i]) : want[i];
    if (!at::equal(got[i], w)) {
      const double diff =
          at::sub(got[i].to(at::kFloat), w.to(at::kFloat)).abs().max().item().toDouble();
      return absl::InternalError(absl::StrCat(when, ": param '", ps[i].name, "' differs (max ",
                                              diff, ")"));
    }
  }
  return absl::OkStatus();
}

struct Run {
  MuonTpMode mode;
  DistributedModel model;
  std::unique_ptr<ChainedOptimizer> opt;
};

absl::Status RunScenario(Communicator& world, DistributedMode mode, bool blockwise) {
  at::set_num_threads(1);
  const int dp_size = world.size() / kTp;
  ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create(world, Grid(dp_size)));
  Communicator& tp = mesh.tp();
  Communicator& dp = mesh.dp();
  const int tp_rank = tp.rank();
  const std::vector<TpParam> ps = GptLike(2);
  ChainedConfig config = TestConfig(/*max_grad_norm=*/0.0);
  config.count_zero_grads = true;
  const std::map<std::string, FusedSplit> splits = GlobalSplits(ps);
  const std::vector<MuonTpMode> modes =
      blockwise ? std::vector<MuonTpMode>{MuonTpMode::kBlockwise, MuonTpMode::kOwner}
                : std::vector<MuonTpMode>{MuonTpMode::kOwner, MuonTpMode::kDuplicated};
  std::vector<Run> runs;
  for (MuonTpMode m : modes) {
    Run run{m, {}, nullptr};
    ASSIGN_OR_RETURN(run.model, BuildTpModel(ps, kTp, tp_rank, dp_size, kBucketSize));
    ASSIGN_OR_RETURN(run.opt, CreateDistributedOptimizer(run.model.buffers, &dp, config, mode,
                                                         splits, nullptr, nullptr,
                                                         {&tp, &world, m}));
    runs.push_back(std::move(run));
  }
  if (mode == DistributedMode::kSharded && !blockwise) {
    // Refused with the thing named: split params without a tp group, a sharded optimizer without
    // the grid's statistics communicator, one of another size.
    auto expect_error = [&](const TensorParallelOptimizer& options,
                            const std::string& message) -> absl::Status {
      const absl::Status st = CreateDistributedOptimizer(runs[0].model.buffers, &dp, config, mode,
                                                         splits, nullptr, nullptr, options)
                                  .status();
      return Check(st.code() == absl::StatusCode::kInvalidArgument &&
                       absl::StrContains(st.message(), message),
                   absl::StrCat("expected '", message, "', got ", st.ToString()));
    };
    RETURN_IF_ERROR(expect_error({}, "not tensor-parallel (no tp communicator)"));
    RETURN_IF_ERROR(expect_error({&tp, nullptr, MuonTpMode::kOwner},
                                 "needs a statistics communicator spanning the tp x dp grid"));
    if (dp_size > 1) {
      RETURN_IF_ERROR(expect_error({&tp, &tp, MuonTpMode::kOwner},
                                   absl::StrCat("the statistics communicator has 2 ranks; expected "
                                                "the tp 2 x dp ", dp_size, " grid")));
    }
  }
  ASSIGN_OR_RETURN(auto global_ref, TpReference::Create(ps, config, /*tp_rank=*/-1));
  std::unique_ptr<TpReference> local_ref;
  if (blockwise) {
    ASSIGN_OR_RETURN(local_ref, TpReference::Create(ps, config, tp_rank));
  }

  for (int step = 0; step < kSteps; ++step) {
    // The NaN goes into world rank 1's slice only (tp rank 1, dp rank 0).
    const bool poison = step == kNanStep;
    std::vector<StepResult> got;
    std::vector<std::vector<at::Tensor>> before;
    for (Run& run : runs) {
      before.emplace_back();
      for (const at::Tensor& p : run.model.params) before.back().push_back(p.clone());
      RETURN_IF_ERROR(FillAndReduce(ps, run.model, tp_rank, dp, mode, step,
                                    poison && world.rank() == 1));
      ASSIGN_OR_RETURN(StepResult result, run.opt->Step());
      if (mode == DistributedMode::kSharded) {
        ASSIGN_OR_RETURN(auto sync, buffers::LaunchParamSync(dp, run.model.buffers));
        RETURN_IF_ERROR(buffers::WaitAll(sync, dp.timeout()));
      }
      got.push_back(result);
    }
    ASSIGN_OR_RETURN(const StepResult want, global_ref->Step(dp_size, step, poison));
    const std::string when = absl::StrCat("step ", step);
    for (size_t r = 0; r < runs.size(); ++r) {
      const std::string what = absl::StrCat(when, " (", MuonTpModeName(runs[r].mode), ")");
      RETURN_IF_ERROR(Check(got[r].skipped == poison, absl::StrCat(what, ": skipped ",
                                                                   got[r].skipped)));
      RETURN_IF_ERROR(Check(want.skipped == poison, "reference skip"));
      if (poison) {
        RETURN_IF_ERROR(CompareSlices(ps, tp_rank, runs[r].model.params, before[r], false,
                                      what + " after the skipped step"));
        continue;
      }
      // The grad norm: every per-tensor (or per-slice, per-shard) fp32 sum of squares is exact
      // (dp means of multiples of 2^-6 are multiples of 2^-7; squares of multiples of 2^-14 below
      // 1, at most 768 per tensor < 2^24 * 2^-14), then each side rounds one fp32 sqrt per piece
      // (relative u = 2^-24, u(2 + u) on its square) and sums the squares in double in its own
      // order: the sums of squares differ by at most about 4u relative, the norms by 2u = 2^-23;
      // 2^-22 leaves a factor 2 for the double roundings.
      RETURN_IF_ERROR(Check(std::abs(got[r].grad_norm - want.grad_norm) <=
                                std::ldexp(want.grad_norm, -22),
                            absl::StrFormat("%s: grad norm %.17g vs single-process %.17g", what,
                                            got[r].grad_norm, want.grad_norm)));
      // Zero gradients are integers: every element counted once over the grid, exactly.
      RETURN_IF_ERROR(Check(got[r].stats.zero_grads == want.stats.zero_grads,
                            absl::StrCat(what, ": zero gradients ", got[r].stats.zero_grads,
                                         " vs single-process ", want.stats.zero_grads)));
    }
    if (local_ref != nullptr) RETURN_IF_ERROR(local_ref->Step(dp_size, step, poison).status());
    for (size_t r = 0; r < runs.size(); ++r) {
      const std::string what = absl::StrCat(when, " (", MuonTpModeName(runs[r].mode), ")");
      if (runs[r].mode == MuonTpMode::kBlockwise) {
        RETURN_IF_ERROR(CompareSlices(ps, tp_rank, runs[r].model.params, local_ref->params(),
                                      false, what + " vs single-process Muon on the slices"));
      } else {
        RETURN_IF_ERROR(CompareSlices(ps, tp_rank, runs[r].model.params, global_ref->params(),
                                      true, what + " vs single-process Muon on global matrices"));
      }
    }
    if (!blockwise) {
      RETURN_IF_ERROR(CompareSlices(ps, tp_rank, runs[0].model.params, runs[1].model.params,
                                    false, when + ": owner vs duplicated"));
    }
  }
  if (blockwise) {
    // Blockwise is another update: the split matrices end elsewhere than owner's.
    const absl::Status same = CompareSlices(ps, tp_rank, runs[0].model.params,
                                            runs[1].model.params, false, "blockwise vs owner");
    RETURN_IF_ERROR(Check(!same.ok(), "blockwise gave owner's params"));
  }
  return absl::OkStatus();
}

TEST(TpMuonTest, ShardedOwnerAndDuplicatedMatchGlobalMuonTp2Dp2) {
  RunOnRanks(4, [](Communicator& world) {
    ASSERT_OK(RunScenario(world, DistributedMode::kSharded, /*blockwise=*/false));
  });
}

TEST(TpMuonTest, ShardedOwnerAndDuplicatedMatchGlobalMuonTp2Dp1) {
  RunOnRanks(2, [](Communicator& world) {
    ASSERT_OK(RunScenario(world, DistributedMode::kSharded, /*blockwise=*/false));
  });
}

TEST(TpMuonTest, ReplicatedOwnerAndDuplicatedMatchGlobalMuonTp2Dp2) {
  RunOnRanks(4, [](Communicator& world) {
    ASSERT_OK(RunScenario(world, DistributedMode::kReplicated, /*blockwise=*/false));
  });
}

TEST(TpMuonTest, ReplicatedOwnerAndDuplicatedMatchGlobalMuonTp2Dp1) {
  RunOnRanks(2, [](Communicator& world) {
    ASSERT_OK(RunScenario(world, DistributedMode::kReplicated, /*blockwise=*/false));
  });
}

TEST(TpMuonTest, BlockwiseMatchesMuonOnSlicesTp2Dp2) {
  RunOnRanks(4, [](Communicator& world) {
    ASSERT_OK(RunScenario(world, DistributedMode::kSharded, /*blockwise=*/true));
  });
}

TEST(TpMuonTest, ReplicatedBlockwiseMatchesMuonOnSlicesTp2Dp1) {
  RunOnRanks(2, [](Communicator& world) {
    ASSERT_OK(RunScenario(world, DistributedMode::kReplicated, /*blockwise=*/true));
  });
}

// Owner's per-rank Newton–Schulz cost for gpt2-124m's 12 layers at tp 2 x dp 2: within 10% of the
// mean (layer-wise ownership over dp, then homes over tp).
TEST(TpMuonTest, OwnerBalancesNewtonSchulzCostGpt2Tp2Dp2) {
  RunOnRanks(4, [](Communicator& world) {
    at::set_num_threads(1);
    ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create(world, Grid(2)));
    const std::vector<TpParam> ps = Gpt2Matrices(12);
    const std::map<std::string, FusedSplit> splits = GlobalSplits(ps);
    ASSERT_OK_AND_ASSIGN(DistributedModel model,
                         BuildTpModel(ps, kTp, mesh.tp().rank(), 2, kBucketSize,
                                      /*with_values=*/false));
    ASSERT_OK_AND_ASSIGN(
        auto opt, CreateDistributedOptimizer(model.buffers, &mesh.dp(), TestConfig(0.0),
                                             DistributedMode::kSharded, splits, nullptr, nullptr,
                                             {&mesh.tp(), &world, MuonTpMode::kOwner}));
    at::Tensor costs = at::zeros({world.size()}, at::kDouble);
    costs[world.rank()].fill_(opt->ns_cost());
    ASSERT_OK_AND_ASSIGN(auto work, world.AllReduce(costs));
    ASSERT_OK(work->Wait(world.timeout()));
    const double total = costs.sum().item<double>();
    const double mean = total / world.size();
    double total_global = 0.0;  // each matrix once
    for (const TpParam& p : ps) total_global += NsCost(p.shape[0], p.shape[1], p.split);
    EXPECT_DOUBLE_EQ(total, total_global);
    for (int r = 0; r < world.size(); ++r) {
      const double c = costs[r].item<double>();
      if (world.rank() == 0) {
        std::printf("gpt2-124m tp 2 x dp 2 owner: rank %d ns_cost %.4g (%.4f of the mean)\n", r, c,
                    c / mean);
      }
      EXPECT_LE(std::abs(c - mean), 0.10 * mean) << "rank " << r;
    }
  });
}

}  // namespace
}  // namespace orthoshard::optimizers::distributed::testing
