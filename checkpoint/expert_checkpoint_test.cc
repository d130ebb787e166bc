// Checkpoints of expert-parallel runs (MoE) in real multi-process Gloo jobs, resharded across
// (world, ep). Each rank holds the dense params and its ep rank's E / ep experts under their global
// names, the experts in buffers sharded over its expert data-parallel group (expt_dp = world / ep),
// as integration/setup.cc builds them. Every rank writes the same deterministic gradients
// (multiples of 2^-5: their averages over any group are exact), so the trajectory is the same
// bits at any (world, ep) and in either mode: the test compares whole tensors, params and every
// optimizer state tensor reassembled from its pieces, between checkpoints.
//   Straight       3 steps at the saving (world, ep), saved at step 3: the reference.
//   Save + resume  2 steps, saved; loaded at another (world, ep) (and mode or residency), 1 more
//                  step, saved at step 3: every param and state tensor equals the reference's,
//                  bitwise, and each is saved exactly once (the commit refuses a second writer).
// Saved at 4 ranks ep 2 (expt_dp 2: expert shards split between the copies) resumes at 2 ranks ep 1
// and ep 2, 4 ranks ep 4 and 1 rank; saved at 2 ranks ep 2 at 1 rank; replicated and sharded
// residency (fsdp) saves resume in the other modes.
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ops/arange.h>
#include <ATen/ops/remainder.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "buffers/bucket_sync.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard.h"
#include "collectives/mesh.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::checkpoint {
namespace {

using collectives::Communicator;
using optimizers::distributed::testing::Check;

namespace od = optimizers::distributed;

constexpr int kExperts = 4;
constexpr int64_t kBucketSize = 120;
constexpr int kSteps = 3;

// How one job lays out and steps the model.
struct RunConfig {
  int ep = 1;
  bool replicated = false;    // every rank steps every param; else sharded (layer-wise Muon)
  bool shard_params = false;  // sharded residency (ZeRO-3, --dist=fsdp)
};

layout::ParamSpec Spec(std::string name, std::vector<int64_t> shape, layout::ParamRole role,
                       bool expert) {
  layout::ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.dtype = DType::kFloat32;
  s.role = role;
  s.expert = expert;
  return s;
}

// An MoE-shaped model as ep rank `ep_rank` of `ep` holds it: dense embedding, attention matrix,
// norm and router, and for each of its experts two Muon matrices and an AdamW vector of 200
// elements (more than half its distopt bucket, padded to 256: at expt_dp 2 it straddles two shards,
// so its AdamW state is cut into pieces across expt_dp ranks, and a sharded-residency save gathers
// its bucket over expt_dp).
std::vector<layout::ParamSpec> Specs(int ep, int ep_rank) {
  using layout::ParamRole;
  std::vector<layout::ParamSpec> specs = {
      Spec("embedding.weight", {12, 8}, ParamRole::kAdam, false),
      Spec("layers.0.attn.proj.weight", {8, 8}, ParamRole::kMuon, false),
      Spec("layers.0.mlp_norm.weight", {8}, ParamRole::kAdam, false),
      Spec("layers.0.mlp.router.weight", {kExperts, 8}, ParamRole::kAdam, false)};
  const int per_rank = kExperts / ep;
  for (int e = ep_rank * per_rank; e < (ep_rank + 1) * per_rank; ++e) {
    const std::string expert = absl::StrCat("layers.0.mlp.experts.", e, ".");
    specs.push_back(Spec(expert + "fc1.weight", {12, 8}, ParamRole::kMuon, true));
    specs.push_back(Spec(expert + "fc2.weight", {8, 6}, ParamRole::kMuon, true));
    specs.push_back(Spec(expert + "bias", {200}, ParamRole::kAdam, true));
  }
  return specs;
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Multiples of 2^-6 in [-0.5, 0.5), a function of the name and `salt` alone (so of the global
// name, whichever rank holds the param): exact under averaging over up to 4 ranks.
at::Tensor ValueOf(const layout::ParamSpec& spec, int salt) {
  const int64_t offset = static_cast<int64_t>(Fnv1a(spec.name) % 61) + 11 * salt;
  at::Tensor t = at::arange(spec.numel(), at::kLong).mul_(7).add_(offset);
  return at::remainder(t, 64).sub_(32).to(at::kFloat).div_(64.0).view(spec.shape);
}

// One rank's mesh, buffers and distributed optimizer, built as integration/setup.cc does.
struct Rank {
  std::unique_ptr<collectives::Mesh> mesh;
  layout::FullParamLayout layout;
  std::vector<layout::ParamSpec> specs;
  std::vector<at::Tensor> params;
  std::vector<std::unique_ptr<buffers::ParamAndGradBuffer>> owned;
  std::vector<buffers::ParamAndGradBuffer*> buffers;
  std::unique_ptr<optimizers::ChainedOptimizer> optimizer;

  Communicator& GroupOf(const buffers::ParamAndGradBuffer& b) const {
    return b.layout().key.expert ? mesh->expt_dp() : mesh->dp();
  }
};

absl::StatusOr<std::unique_ptr<Rank>> BuildRank(Communicator& world, const RunConfig& run) {
  auto r = std::make_unique<Rank>();
  collectives::MeshGrid grid = collectives::DataParallelGrid(world.size());
  grid.ep = run.ep;
  ASSIGN_OR_RETURN(collectives::Mesh mesh, collectives::Mesh::Create(world, grid));
  r->mesh = std::make_unique<collectives::Mesh>(std::move(mesh));
  r->specs = Specs(run.ep, r->mesh->ep().rank());
  layout::LayoutOptions options;
  options.dp = world.size();
  options.expert_dp = r->mesh->expt_dp().size();
  options.bucket_size = kBucketSize;
  ASSIGN_OR_RETURN(r->layout, layout::ComputeFullParamLayout(r->specs, options));
  for (const layout::ParamSpec& s : r->specs) r->params.push_back(ValueOf(s, 0));
  for (const layout::PerBufferParamLayout& b : r->layout.buffers) {
    buffers::BufferOptions buffer_options;
    buffer_options.residency =
        run.shard_params ? buffers::Residency::kSharded : buffers::Residency::kFull;
    buffer_options.rank = (b.key.expert ? r->mesh->expt_dp() : r->mesh->dp()).rank();
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(b, r->params, buffer_options));
    r->buffers.push_back(buffer.get());
    r->owned.push_back(std::move(buffer));
  }
  const od::DistributedMode mode =
      run.replicated ? od::DistributedMode::kReplicated : od::DistributedMode::kSharded;
  ASSIGN_OR_RETURN(r->optimizer, od::CreateDistributedOptimizer(
                                     r->buffers, &r->mesh->dp(),
                                     optimizers::distributed::testing::TestConfig(0.0), mode, {},
                                     nullptr, &r->mesh->expt_dp()));
  return r;
}

// Runs `launch` for the dense buffers over dp, then for the expert buffers over expt_dp.
absl::Status PerGroup(
    Rank& r,
    const std::function<absl::StatusOr<std::vector<std::unique_ptr<collectives::Work>>>(
        Communicator&, absl::Span<buffers::ParamAndGradBuffer* const>)>& launch) {
  for (const bool expert : {false, true}) {
    std::vector<buffers::ParamAndGradBuffer*> group;
    for (buffers::ParamAndGradBuffer* b : r.buffers) {
      if (b->layout().key.expert == expert) group.push_back(b);
    }
    Communicator& comm = expert ? r.mesh->expt_dp() : r.mesh->dp();
    ASSIGN_OR_RETURN(auto works, launch(comm, group));
    RETURN_IF_ERROR(buffers::WaitAll(works, comm.timeout()));
  }
  return absl::OkStatus();
}

// A training step with the same gradient on every rank: grad sync (averaging exact copies), the
// optimizer step, the param sync.
absl::Status TrainStep(Rank& r, int step, bool replicated) {
  for (buffers::ParamAndGradBuffer* buffer : r.buffers) {
    for (int b = 0; b < buffer->num_buckets(); ++b) buffer->MaterializeGrads(b);
    buffer->ZeroGrads();
    for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
      buffer->GradView(i).copy_(
          ValueOf(r.specs[buffer->layout().params[i].param_index], step + 1).mul_(2.0));
    }
  }
  const buffers::GradSync kind =
      replicated ? buffers::GradSync::kAllReduce : buffers::GradSync::kReduceScatter;
  RETURN_IF_ERROR(PerGroup(r, [kind](Communicator& comm, auto group) {
    return buffers::LaunchGradSync(comm, group, kind, collectives::ReduceOp::kAvg);
  }));
  for (buffers::ParamAndGradBuffer* buffer : r.buffers) {
    if (buffer->residency() != buffers::Residency::kSharded) continue;
    for (int b = 0; b < buffer->num_buckets(); ++b) buffer->ReleaseGrads(b);
  }
  RETURN_IF_ERROR(r.optimizer->Step().status());
  return PerGroup(r, [](Communicator& comm, auto group) {
    return buffers::LaunchParamSync(comm, group);
  });
}

SharedState Shared(int64_t step) {
  SharedState s;
  s.step = step;
  s.data_position = absl::StrCat("position ", step);
  s.model_config = "moe-test";
  s.optimizer_config = "test";
  return s;
}

// "straight": kSteps steps, saved under `root`. "save": kSteps - 1 steps, saved under `root`.
// "resume": loads `from`, checks the step, one more step, saved under `root`.
absl::Status RunScenario(const std::string& scenario, const std::string& from,
                         const std::string& root, const RunConfig& run, Communicator& world) {
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, BuildRank(world, run));
  int first = 0;
  if (scenario == "resume") {
    ASSIGN_OR_RETURN(const SharedState loaded,
                     LoadDistributedCheckpoint(from, r->buffers, *r->optimizer, world,
                                               &r->mesh->expt_dp()));
    RETURN_IF_ERROR(Check(loaded.step == kSteps - 1 && loaded.data_position == "position 2" &&
                              r->optimizer->steps_taken() == kSteps - 1,
                          absl::StrCat("loaded step ", loaded.step, ", optimizer steps ",
                                       r->optimizer->steps_taken())));
    first = kSteps - 1;
  }
  if (scenario == "save" && run.shard_params) {
    // The snapshot's gather over expt_dp is exercised: an expert param straddles a shard boundary.
    bool straddler = false;
    for (const buffers::ParamAndGradBuffer* b : r->buffers) {
      for (const layout::ParamPlacement& p : b->layout().params) {
        straddler = straddler || (b->layout().key.expert && b->layout().OwnerOf(p) < 0);
      }
    }
    RETURN_IF_ERROR(Check(straddler, "no expert param straddles a shard boundary"));
  }
  const int last = scenario == "save" ? kSteps - 1 : kSteps;
  for (int step = first; step < last; ++step) {
    RETURN_IF_ERROR(TrainStep(*r, step, run.replicated));
  }
  return SaveDistributedCheckpoint(root, Shared(last), r->buffers, *r->optimizer, world, {},
                                   &r->mesh->expt_dp());
}

void RunJob(const std::string& scenario, const std::string& from, const std::string& root,
            int world, const RunConfig& run) {
  collectives::testing::RunOnRanks(world, [&](Communicator& comm) {
    ASSERT_OK(RunScenario(scenario, from, root, run, comm));
  });
}

std::string FreshRoot(const std::string& name) {
  const std::string root = JoinPath(::testing::TempDir(), name);
  if (!collectives::testing::InRankProcess()) {  // a later launch's ranks must find the files
    EXPECT_OK(RemoveRecursively(root));
  }
  return root;
}

size_t DTypeBytes(const std::string& dtype) {
  return dtype == "F64" || dtype == "I64" ? 8 : dtype == "F32" || dtype == "I32" ? 4 : 2;
}

// Every tensor of the checkpoint at `dir`, whole: "param <name>" and "state <name>" (the state
// pieces placed at their offsets; overlapping pieces, the counters every rank saves, must agree).
absl::StatusOr<std::map<std::string, std::string>> WholeTensors(const std::string& dir) {
  ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(dir));
  std::map<std::string, std::string> out;
  std::map<std::string, std::vector<bool>> covered;
  for (const TensorRecord& t : reader.manifest().tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.global_shape()) numel *= d;
    const size_t size = DTypeBytes(t.dtype());
    std::string bytes(numel * size, '\0');
    const std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
    RETURN_IF_ERROR(reader.Read(t.name(), t.kind(), t.dtype(), shape,
                                absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()),
                                               bytes.size())));
    if (t.kind() == kParamKind) {
      RETURN_IF_ERROR(Check(out.emplace("param " + t.name(), bytes).second,
                            "param " + t.name() + " saved twice"));
      continue;
    }
    const std::vector<std::string> kind = absl::StrSplit(t.kind(), absl::ByAnyChar("@."));
    int64_t offset = 0;
    RETURN_IF_ERROR(Check(kind.size() == 3 && kind[0] == "state" &&
                              absl::SimpleAtoi(kind[1], &offset),
                          "unexpected record kind " + t.kind()));
    const std::string full_shape = reader.manifest().metadata().at("full_shape/" + t.name());
    int64_t full = 1;
    for (absl::string_view d : absl::StrSplit(full_shape, ',', absl::SkipEmpty())) {
      int64_t v = 0;
      RETURN_IF_ERROR(Check(absl::SimpleAtoi(d, &v), "bad full shape " + full_shape));
      full *= v;
    }
    std::string& whole = out["state " + t.name()];
    std::vector<bool>& done = covered[t.name()];
    whole.resize(full * size);
    done.resize(full);
    for (int64_t i = 0; i < numel; ++i) {
      const std::string piece = bytes.substr(i * size, size);
      if (done[offset + i]) {
        RETURN_IF_ERROR(Check(whole.substr((offset + i) * size, size) == piece,
                              "state pieces of " + t.name() + " disagree"));
      }
      whole.replace((offset + i) * size, size, piece);
      done[offset + i] = true;
    }
  }
  for (const auto& [name, done] : covered) {
    for (bool d : done) RETURN_IF_ERROR(Check(d, "state " + name + " is not saved whole"));
  }
  return out;
}

// The reference's tensors equal `got`'s, name for name and bit for bit.
void ExpectSameTensors(const std::string& want_dir, const std::string& got_dir) {
  ASSERT_OK_AND_ASSIGN(const auto want, WholeTensors(want_dir));
  ASSERT_OK_AND_ASSIGN(const auto got, WholeTensors(got_dir));
  int params = 0;
  for (const auto& [name, bytes] : want) {
    params += absl::StartsWith(name, "param ") ? 1 : 0;
    const auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << got_dir << " lacks " << name;
    } else {
      EXPECT_TRUE(it->second == bytes) << name << " differs in " << got_dir;
    }
  }
  EXPECT_EQ(want.size(), got.size()) << got_dir;
  EXPECT_EQ(params, 4 + 3 * kExperts) << "every param of the model, every expert, once";
}

// Saves at (save_world, save ep) in `save` mode, resumes at each of `targets` (world, config) and
// compares each resumed step-3 checkpoint with the straight run's.
void SaveAndResume(const std::string& name, int save_world, const RunConfig& save,
                   const std::vector<std::pair<int, RunConfig>>& targets) {
  const std::string straight = FreshRoot(name + "_straight"), saved = FreshRoot(name + "_saved");
  RunJob("straight", "", straight, save_world, save);
  RunJob("save", "", saved, save_world, save);
  for (const auto& [world, run] : targets) {
    const std::string label = absl::StrCat(name, "_to_", world, "_ep", run.ep,
                                           run.replicated ? "_replicated" : "",
                                           run.shard_params ? "_fsdp" : "");
    const std::string resumed = FreshRoot(label);
    RunJob("resume", saved, resumed, world, run);
    if (!collectives::testing::InRankProcess()) {
      SCOPED_TRACE(label);
      ExpectSameTensors(JoinPath(straight, "step_000003"), JoinPath(resumed, "step_000003"));
    }
  }
}

TEST(ExpertCheckpointTest, SavedAtFourRanksEpTwoResumesAtAnyWorldAndEp) {
  SaveAndResume("w4ep2", 4, {2},
                {{2, RunConfig{1}}, {2, RunConfig{2}}, {4, RunConfig{4}}, {1, RunConfig{1}}});
}

TEST(ExpertCheckpointTest, SavedAtTwoRanksEpTwoResumesOnOneRank) {
  SaveAndResume("w2ep2", 2, {2}, {{1, RunConfig{1}}});
}

TEST(ExpertCheckpointTest, ReplicatedSaveResumesShardedAndFsdp) {
  SaveAndResume("replicated", 4, {2, /*replicated=*/true},
                {{2, RunConfig{2}}, {2, RunConfig{1, false, /*shard_params=*/true}}});
}

TEST(ExpertCheckpointTest, FsdpSaveResumesReplicatedAndFull) {
  SaveAndResume("fsdp", 4, {2, false, /*shard_params=*/true},
                {{2, RunConfig{1, /*replicated=*/true}}, {4, RunConfig{4}}});
}

}  // namespace
}  // namespace orthoshard::checkpoint
