// The distributed optimizer (CreateDistributedOptimizer) in real multi-process Gloo jobs at 1 to 4
// ranks (the multi-rank harness). Each scenario builds the test model's buffers over all ranks, fills
// per-rank gradients, reduce-scatters (or all-reduces) them itself as DDP would, steps, runs the
// param sync, and compares with a single-process ChainedOptimizer on the mean gradients. What each
// scenario proves:
//   sharded      layer-wise Muon + ZeRO-1 AdamW after 3 steps: every rank's params bitwise equal to
//                a single-process ChainedOptimizer on the mean gradients (and to each other)
//   sharded_lpt  the same over Megatron's LPT shard-aligned layout
//   replicated   the all-reduce baseline, bitwise equal too
//   sharded_split / replicated_split  the same with fused qkv (2 groups of Q, K, V) and fc1 (gate,
//                up) splits given to both: Muon orthogonalises per block in both modes, bitwise
//                equal to the single-process ChainedOptimizer with the same splits
//   idle         2 Muon matrices at dp 3 and 4: ranks owning none stay consistent
//   nonfinite    a NaN gradient on one rank: every rank skips, params and state bitwise unchanged
//   clip         clipping by the global norm (one all-reduce): the norm within 2^-22 relative of
//                the single-process one (per-slice sums of squares are exact, each slice rounds
//                one fp32 sqrt; see the worker), and given the agreed statistics the reference's
//                params bitwise equal
//   export/import  state exported at dp 2 (3), imported from model-space records at dp 3 (2):
//                the next 3 steps equal the single-process 6-step trajectory bitwise; also a
//                sharded export resumed in replicated mode (import_replicated)
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "buffers/bucket_sync.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::optimizers::distributed::testing {
namespace {

using collectives::Communicator;
using collectives::testing::RunOnRanks;

using collectives::Communicator;

constexpr int kBucketSize = 300;
constexpr int kSteps = 3;

struct Options {
  std::string scenario;
  std::string dir;
  int old_dp = 0;
};

// Rank 0's params broadcast to every rank equal this rank's, bitwise.
absl::Status CompareAcrossRanks(Communicator& comm, const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    at::Tensor copy = p.clone();
    ASSIGN_OR_RETURN(auto work, comm.Broadcast(copy));
    RETURN_IF_ERROR(work->Wait(comm.timeout()));
    RETURN_IF_ERROR(Check(at::equal(copy, p), "params differ between ranks"));
  }
  return absl::OkStatus();
}

absl::Status ReduceGrads(Communicator& comm, DistributedModel& model, DistributedMode mode) {
  const buffers::GradSync sync = mode == DistributedMode::kSharded
                                     ? buffers::GradSync::kReduceScatter
                                     : buffers::GradSync::kAllReduce;
  ASSIGN_OR_RETURN(auto works, buffers::LaunchGradSync(comm, model.buffers, sync,
                                                       collectives::ReduceOp::kAvg));
  return buffers::WaitAll(works, comm.timeout());
}

// ---- record files for the export/import scenario ----

void WriteRecords(const std::string& path, const std::vector<StateRecord>& records) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&out](int64_t v) { out.write(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(static_cast<int64_t>(records.size()));
  for (const StateRecord& r : records) {
    put(static_cast<int64_t>(r.name.size()));
    out.write(r.name.data(), r.name.size());
    put(static_cast<int64_t>(r.full_shape.size()));
    for (int64_t d : r.full_shape) put(d);
    put(r.offset);
    put(static_cast<int64_t>(r.tensor.scalar_type()));
    put(r.tensor.dim());
    put(r.tensor.numel());
    at::Tensor t = r.tensor.contiguous();
    out.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
}

std::vector<StateRecord> ReadRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  auto get = [&in]() {
    int64_t v = 0;
    in.read(reinterpret_cast<char*>(&v), sizeof(v));
    return v;
  };
  std::vector<StateRecord> records(get());
  for (StateRecord& r : records) {
    r.name.resize(get());
    in.read(r.name.data(), r.name.size());
    r.full_shape.resize(get());
    for (int64_t& d : r.full_shape) d = get();
    r.offset = get();
    const auto dtype = static_cast<at::ScalarType>(get());
    const int64_t dim = get();
    const int64_t numel = get();
    r.tensor = dim == 0 ? at::empty({}, dtype) : at::empty({numel}, dtype);
    in.read(static_cast<char*>(r.tensor.data_ptr()), r.tensor.nbytes());
  }
  return records;
}

// ---- scenarios ----

absl::Status RunScenario(const Options& o, Communicator& comm) {
  const int dp = comm.size();
  const int rank = comm.rank();
  const std::string& s = o.scenario;
  const bool replicated = s == "replicated" || s == "import_replicated" ||
                          s == "replicated_split" || s == "export_replicated";
  const bool with_splits = s == "sharded_split" || s == "replicated_split";
  const DistributedMode mode = replicated ? DistributedMode::kReplicated : DistributedMode::kSharded;
  const layout::Strategy strategy =
      s == "sharded_lpt" ? layout::Strategy::kMegatronLpt : layout::Strategy::kLayerwise;
  const std::vector<layout::ParamSpec> specs = s == "idle" ? SmallModel(1, /*only_two_matrices=*/true) : SmallModel(2);
  const double max_norm = s == "clip" ? 1.0 : 0.0;
  const ChainedConfig config = TestConfig(max_norm);

  ASSIGN_OR_RETURN(DistributedModel model, BuildDistributedModel(specs, dp, strategy, kBucketSize));
  const std::map<std::string, FusedSplit> splits =
      with_splits ? SmallModelSplits(specs) : std::map<std::string, FusedSplit>{};
  ASSIGN_OR_RETURN(auto opt, CreateDistributedOptimizer(model.buffers, &comm, config, mode, splits));
  ASSIGN_OR_RETURN(auto ref, Reference::Create(specs, config, splits));
  if (with_splits) {
    // Bad splits are rejected with the param named.
    auto expect_error = [&](std::map<std::string, FusedSplit> bad,
                            const std::string& message) -> absl::Status {
      absl::Status st = CreateDistributedOptimizer(model.buffers, &comm, config, mode, bad).status();
      return Check(st.code() == absl::StatusCode::kInvalidArgument &&
                       absl::StrContains(st.message(), message),
                   absl::StrCat("bad split: expected '", message, "', got ", st.ToString()));
    };
    RETURN_IF_ERROR(expect_error({{"nope.weight", FusedSplit{1, {2}}}},
                                 "fused split given for unknown param 'nope.weight'"));
    RETURN_IF_ERROR(expect_error({{"layers.0.attn.qkv.weight", FusedSplit{2, {16, 4}}}},
                                 "param 'layers.0.attn.qkv.weight': fused split"));
    // The splits must matter: a reference that orthogonalises fused weights whole ends elsewhere.
    ASSIGN_OR_RETURN(auto unsplit, Reference::Create(specs, config));
    RETURN_IF_ERROR(ref->Step(dp, 0).status());
    RETURN_IF_ERROR(unsplit->Step(dp, 0).status());
    RETURN_IF_ERROR(Check(CompareParamsBitwise(specs, ref->params(), unsplit->params(), "split")
                              .code() == absl::StatusCode::kInternal,
                          "fused splits did not change the single-process update"));
    ASSIGN_OR_RETURN(ref, Reference::Create(specs, config, splits));
  }

  if (s == "idle") {
    // Two matrices over 3 or 4 ranks: exactly two owners, the other ranks idle.
    const int64_t owned = opt->muon().num_slots();
    at::Tensor counts = at::empty({2}, at::kLong);
    counts[0].fill_(owned);
    counts[1].fill_(owned == 0 ? 1 : 0);
    ASSIGN_OR_RETURN(auto work, comm.AllReduce(counts));
    RETURN_IF_ERROR(work->Wait(comm.timeout()));
    RETURN_IF_ERROR(Check(counts[0].item().toLong() == 2 && counts[1].item().toLong() == dp - 2,
                          absl::StrCat("owned matrices ", counts[0].item().toLong(),
                                       ", idle ranks ", counts[1].item().toLong())));
  }

  int first_step = 0;
  if (s == "import" || s == "import_replicated") {
    // Resume from every old rank's records (written at dp old_dp) and replay the reference.
    std::vector<StateRecord> records, params;
    for (int r = 0; r < o.old_dp; ++r) {
      for (StateRecord& t : ReadRecords(absl::StrCat(o.dir, "/rank", r, ".bin"))) {
        (absl::StartsWith(t.name, "param/") ? params : records).push_back(std::move(t));
      }
    }
    ASSIGN_OR_RETURN(std::vector<StateRecord> whole, AssembleModelSpace(params));
    for (size_t i = 0; i < specs.size(); ++i) {
      bool found = false;
      for (const StateRecord& t : whole) {
        if (t.name == "param/" + specs[i].name) {
          model.params[i].copy_(t.tensor);
          found = true;
        }
      }
      RETURN_IF_ERROR(Check(found, "no saved value of " + specs[i].name));
    }
    RETURN_IF_ERROR(opt->ImportState(records));
    for (int step = 0; step < kSteps; ++step) RETURN_IF_ERROR(ref->Step(o.old_dp, step).status());
    first_step = kSteps;
    RETURN_IF_ERROR(Check(opt->steps_taken() == kSteps, "steps not restored"));
  }

  for (int step = first_step; step < first_step + kSteps; ++step) {
    FillRankGrads(specs, model, rank, step);
    const bool poison = s == "nonfinite" && step == 1;
    const layout::ParamPlacement& poisoned = model.buffers[0]->layout().params[0];
    if (poison && rank == dp - 1) model.buffers[0]->grad_data()[poisoned.start].fill_(NAN);
    RETURN_IF_ERROR(ReduceGrads(comm, model, mode));

    std::vector<at::Tensor> before;
    std::vector<StateRecord> state_before;
    if (poison) {
      for (const at::Tensor& p : model.params) before.push_back(p.clone());
      state_before = opt->ExportState();
    }
    ASSIGN_OR_RETURN(StepResult got, opt->Step());
    ASSIGN_OR_RETURN(auto param_sync, buffers::LaunchParamSync(comm, model.buffers));
    RETURN_IF_ERROR(buffers::WaitAll(param_sync, comm.timeout()));
    // The reference sees the NaN in the param the poisoned element belongs to.
    const int nan_param = poison ? poisoned.param_index : -1;
    // With clipping, the reference decides from the statistics the ranks agreed on (checked
    // below), so that both scale the same gradients by the same factor.
    ASSIGN_OR_RETURN(StepResult want,
                     ref->Step(dp, step, nan_param, s == "clip" ? &got.stats : nullptr));
    RETURN_IF_ERROR(Check(got.skipped == want.skipped,
                          absl::StrCat("step ", step, ": skipped ", got.skipped, " vs ",
                                       want.skipped)));
    if (poison) {
      RETURN_IF_ERROR(Check(got.skipped, "non-finite step not skipped"));
      RETURN_IF_ERROR(CompareParamsBitwise(specs, model.params, before, "after a skipped step"));
      std::vector<StateRecord> state_after = opt->ExportState();
      RETURN_IF_ERROR(Check(state_after.size() == state_before.size(), "state changed size"));
      for (size_t i = 0; i < state_after.size(); ++i) {
        if (state_after[i].name == "chained/skipped_steps") continue;  // counts the skip
        RETURN_IF_ERROR(Check(at::equal(state_after[i].tensor, state_before[i].tensor),
                              "state changed by a skipped step: " + state_after[i].name));
      }
      RETURN_IF_ERROR(Check(opt->skipped_steps() == 1, "skip not counted"));
    }
    if (s == "clip") {
      RETURN_IF_ERROR(Check(got.clip_scale < 1.0, "clipping not active"));
      // The norm the ranks agreed on against the reference's own from the same gradients. The
      // per-slice sums of squares are exact (RankGrad); each side then rounds one fp32 sqrt per
      // slice or tensor (relative u = 2^-24, so u(2 + u) on its square) and sums those squares in
      // double, so the two sums of squares differ by at most about 4u relative, the norms by 2u =
      // 2^-23; 2^-22 leaves a factor 2 for the double roundings.
      ASSIGN_OR_RETURN(const GradStats own, ref->optimizer().LocalGradStats());
      const double own_norm = std::sqrt(own.adamw_sum_squares + own.muon_sum_squares);
      RETURN_IF_ERROR(Check(std::abs(got.grad_norm - own_norm) <= std::ldexp(own_norm, -22),
                            absl::StrFormat("global norm %.17g vs %.17g", got.grad_norm,
                                            own_norm)));
    } else if (!got.skipped) {
      RETURN_IF_ERROR(Check(got.clip_scale == 1.0, "unexpected clipping"));
    }
    RETURN_IF_ERROR(CompareParamsBitwise(specs, model.params, ref->params(), absl::StrCat("step ", step)));
  }
  RETURN_IF_ERROR(CompareAcrossRanks(comm, model.params));

  if (s == "export" || s == "export_replicated") {
    std::vector<StateRecord> records = opt->ExportState();
    if (rank == 0) {
      for (size_t i = 0; i < specs.size(); ++i) {
        records.push_back({"param/" + specs[i].name, specs[i].shape, 0,
                           model.params[i].reshape({-1}).clone()});
      }
    }
    WriteRecords(absl::StrCat(o.dir, "/rank", rank, ".bin"), records);
  }
  return absl::OkStatus();
}


// Runs `scenario` on `world` ranks (records of export/import in the test's temporary directory).
void RunJob(const std::string& scenario, int world, int old_dp = 0) {
  RunOnRanks(world, [&](Communicator& comm) {
    ASSERT_OK(RunScenario({scenario, ::testing::TempDir(), old_dp}, comm));
  });
}

class DistributedOptimizerTest : public ::testing::TestWithParam<int> {};

TEST_P(DistributedOptimizerTest, ShardedMatchesSingleProcessBitwise) { RunJob("sharded", GetParam()); }

TEST_P(DistributedOptimizerTest, ReplicatedMatchesSingleProcessBitwise) {
  RunJob("replicated", GetParam());
}

TEST_P(DistributedOptimizerTest, FusedSplitsMatchSingleProcessBitwise) {
  RunJob("sharded_split", GetParam());
  RunJob("replicated_split", GetParam());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedOptimizerTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

TEST(DistributedOptimizerTest, MegatronLptLayoutMatchesBitwise) {
  RunJob("sharded_lpt", 2);
  RunJob("sharded_lpt", 3);
}

TEST(DistributedOptimizerTest, MoreRanksThanMuonMatricesLeavesIdleRanksConsistent) {
  RunJob("idle", 3);
  RunJob("idle", 4);
}

TEST(DistributedOptimizerTest, NonFiniteGradientOnOneRankSkipsEverywhere) {
  RunJob("nonfinite", 2);
  RunJob("nonfinite", 3);
}

TEST(DistributedOptimizerTest, ClipsByTheGlobalNorm) {
  RunJob("clip", 2);
  RunJob("clip", 4);
}

TEST(DistributedOptimizerTest, StateExportedAtTwoRanksResumesAtThree) {
  RunJob("export", 2);
  RunJob("import", 3, 2);
}

TEST(DistributedOptimizerTest, StateExportedAtThreeRanksResumesAtTwo) {
  RunJob("export", 3);
  RunJob("import", 2, 3);
}

TEST(DistributedOptimizerTest, ShardedStateResumesInReplicatedMode) {
  RunJob("export", 2);
  RunJob("import_replicated", 2, 2);
}

TEST(DistributedOptimizerTest, ReplicatedStateResumesInShardedModeAtAnotherSize) {
  RunJob("export_replicated", 2);
  RunJob("import", 3, 2);
}

TEST(DistributedOptimizerTest, BufferOfAnotherDpIsRejected) {
  RunOnRanks(1, [](Communicator& comm) {
    const std::vector<layout::ParamSpec> specs = SmallModel(1);
    ASSERT_OK_AND_ASSIGN(DistributedModel model,
                         BuildDistributedModel(specs, 2, layout::Strategy::kLayerwise, kBucketSize));
    EXPECT_THAT(CreateDistributedOptimizer(model.buffers, &comm, TestConfig(0.0),
                                           DistributedMode::kSharded)
                    .status(),
                orthoshard::testing::StatusIs(
                    absl::StatusCode::kInvalidArgument,
                    ::testing::HasSubstr("is sharded over dp 2, the communicator has 1 ranks")));
  });
}

}  // namespace
}  // namespace orthoshard::optimizers::distributed::testing
