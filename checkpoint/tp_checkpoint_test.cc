// Checkpoints of tensor-parallel runs in real multi-process Gloo jobs, resharded across (tp, dp).
// Each rank holds the tp-local slices of a GPT-like model's split params (QKV-like: dim 0, 1 part;
// fc1-like: dim 0, 2 parts (gate, up); proj-like: dim 1; a vocab-split embedding; a split AdamW
// bias large enough to straddle ZeRO-1 shards) and the whole of a replicated norm, its values the
// slice of deterministic whole tensors, in buffers sharded over its dp group (mesh.dp()), stepped
// by the distributed optimizer over that group (AdamW for vectors and the embedding; Muon for the
// matrices, whose update on a tp-local slice needs no tp communication). Every rank's gradient is
// the slice of a deterministic whole gradient (multiples of 2^-5: averages over dp are exact).
//
// Saved at tp 2 x dp 2 after a few steps, the checkpoint loads at tp 1 x dp 4, tp 4 x dp 1,
// tp 1 x dp 1 and tp 2 x dp 1: each rank dumps what it holds (local params, its optimizer's
// exported state pieces), the test process reassembles whole tensors from every run's dumps with
// its own slicing (chunk/cat, not the library's), and every param and state tensor of every load
// equals the save's bit for bit; a resume at tp 2 (dp 1 or 2) continues bit for bit as the
// straight run; a tp-1 save loads at tp 2. A model of other whole shapes is refused naming the
// param; a checkpoint lacking a param slice or a state slice is refused; a save whose tp ranks
// disagree on a split is not committed. The whole-tensor readers (CheckpointReader, `ckpt export`)
// assemble the whole tensors the save held.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/remainder.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "buffers/bucket_sync.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/commit.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tool/ckpt_commands.h"
#include "checkpoint/tp_slices.h"
#include "collectives/mesh.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "common/tp_split.h"
#include "gtest/gtest.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"
#include "optimizers/state.h"

namespace orthoshard::checkpoint {
namespace {

using collectives::Communicator;
using optimizers::distributed::testing::Check;
using ::testing::HasSubstr;
using ::orthoshard::testing::StatusIs;

namespace od = optimizers::distributed;

constexpr int64_t kBucketSize = 120;
constexpr int kSteps = 3;

// A param of the whole model and how tensor parallelism splits it (size and rank: the run's).
struct GlobalParam {
  std::string name;
  std::vector<int64_t> shape;  // whole
  layout::ParamRole role;
  int dim = -1;
  int64_t parts = 1;
};

// `fc1_cols`: fc1's input width (8; another value makes a model of other whole shapes).
std::vector<GlobalParam> Model(int64_t fc1_cols = 8) {
  using layout::ParamRole;
  return {{"embedding.weight", {16, 8}, ParamRole::kAdam, 0, 1},
          {"layers.0.attn.qkv.weight", {24, 8}, ParamRole::kMuon, 0, 1},
          {"layers.0.attn.qkv.bias", {200}, ParamRole::kAdam, 0, 1},
          {"layers.0.attn.proj.weight", {8, 8}, ParamRole::kMuon, 1, 1},
          {"layers.0.mlp_norm.weight", {8}, ParamRole::kAdam, -1, 1},
          {"layers.0.mlp.fc1.weight", {16, fc1_cols}, ParamRole::kMuon, 0, 2}};
}

struct Grid {
  int tp = 1;
  int dp = 1;
  std::string Label() const { return absl::StrCat("tp", tp, "_dp", dp); }
};

TpSplit SplitOf(const GlobalParam& g, int tp, int tp_rank) {
  TpSplit s;
  if (g.dim < 0 || tp == 1) return s;
  s.dim = g.dim;
  s.parts = g.parts;
  s.size = tp;
  s.rank = tp_rank;
  return s;
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Multiples of 2^-6 in [-0.5, 0.5): a function of the param's name, whole shape and `salt`.
at::Tensor WholeValue(const GlobalParam& g, int salt) {
  int64_t numel = 1;
  for (int64_t d : g.shape) numel *= d;
  const int64_t offset = static_cast<int64_t>(Fnv1a(g.name) % 61) + 11 * salt;
  at::Tensor t = at::arange(numel, at::kLong).mul_(7).add_(offset);
  return at::remainder(t, 64).sub_(32).to(at::kFloat).div_(64.0).view(g.shape);
}

// The test's own tp slicing: each of the `parts` chunks along dim cut into tp chunks, rank r's
// chunk of every part concatenated; and its inverse.
at::Tensor Slice(const at::Tensor& whole, const GlobalParam& g, int tp, int tp_rank) {
  if (g.dim < 0 || tp == 1) return whole.clone();
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& part : whole.chunk(g.parts, g.dim)) {
    pieces.push_back(part.chunk(tp, g.dim)[tp_rank]);
  }
  return at::cat(pieces, g.dim).contiguous();
}

at::Tensor Unslice(const std::vector<at::Tensor>& locals, const GlobalParam& g) {
  const int tp = static_cast<int>(locals.size());
  if (g.dim < 0 || tp == 1) return locals[0];
  std::vector<at::Tensor> parts;
  for (int64_t p = 0; p < g.parts; ++p) {
    std::vector<at::Tensor> slices;
    for (const at::Tensor& l : locals) slices.push_back(l.chunk(g.parts, g.dim)[p]);
    parts.push_back(at::cat(slices, g.dim));
  }
  return at::cat(parts, g.dim).contiguous();
}

// One rank's mesh, buffers and distributed optimizer.
struct Rank {
  std::unique_ptr<collectives::Mesh> mesh;
  std::vector<GlobalParam> model;
  std::vector<layout::ParamSpec> specs;
  layout::FullParamLayout layout;
  std::vector<at::Tensor> params;
  std::vector<std::unique_ptr<buffers::ParamAndGradBuffer>> owned;
  std::vector<buffers::ParamAndGradBuffer*> buffers;
  std::unique_ptr<optimizers::ChainedOptimizer> optimizer;
  TensorParallelism tp;
};

absl::StatusOr<std::unique_ptr<Rank>> BuildRank(Communicator& world, const Grid& grid,
                                                std::vector<GlobalParam> model) {
  auto r = std::make_unique<Rank>();
  collectives::MeshGrid mesh_grid;
  mesh_grid.tp = grid.tp;
  mesh_grid.dp = grid.dp;
  ASSIGN_OR_RETURN(collectives::Mesh mesh, collectives::Mesh::Create(world, mesh_grid));
  r->mesh = std::make_unique<collectives::Mesh>(std::move(mesh));
  r->model = std::move(model);
  const int tp_rank = r->mesh->tp().rank();
  r->tp.dp_comm = &r->mesh->dp();
  r->tp.size = grid.tp;
  r->tp.rank = tp_rank;
  for (const GlobalParam& g : r->model) {
    layout::ParamSpec s;
    s.name = g.name;
    s.tp = SplitOf(g, grid.tp, tp_rank);
    s.shape = TpLocalShape(g.shape, s.tp);
    s.dtype = DType::kFloat32;
    s.role = g.role;
    if (s.tp.split()) r->tp.splits[g.name] = s.tp;
    r->specs.push_back(s);
    r->params.push_back(Slice(WholeValue(g, 0), g, grid.tp, tp_rank));
  }
  layout::LayoutOptions options;
  options.dp = grid.dp;
  options.bucket_size = kBucketSize;
  ASSIGN_OR_RETURN(r->layout, layout::ComputeFullParamLayout(r->specs, options));
  for (const layout::PerBufferParamLayout& b : r->layout.buffers) {
    buffers::BufferOptions buffer_options;
    buffer_options.rank = r->mesh->dp().rank();
    ASSIGN_OR_RETURN(std::unique_ptr<buffers::ParamAndGradBuffer> buffer,
                     buffers::ParamAndGradBuffer::Create(b, r->params, buffer_options));
    r->buffers.push_back(buffer.get());
    r->owned.push_back(std::move(buffer));
  }
  // Blockwise Muon at tp > 1: each slice's update is its own (no tp exchange), which is all the
  // resharding needs; the statistics over the whole grid.
  od::TensorParallelOptimizer tensor_parallel;
  if (grid.tp > 1) {
    tensor_parallel = {&r->mesh->tp(), &world, optimizers::MuonTpMode::kBlockwise};
  }
  ASSIGN_OR_RETURN(r->optimizer,
                   od::CreateDistributedOptimizer(r->buffers, &r->mesh->dp(),
                                                  optimizers::distributed::testing::TestConfig(0.0),
                                                  od::DistributedMode::kSharded, {}, nullptr,
                                                  nullptr, tensor_parallel));
  return r;
}

// Grad sync over dp (averaging the same slice on every dp rank: exact), step, param sync.
absl::Status TrainStep(Rank& r, int step) {
  const int tp = r.tp.size, tp_rank = r.tp.rank;
  for (buffers::ParamAndGradBuffer* buffer : r.buffers) {
    buffer->ZeroGrads();
    for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
      const GlobalParam& g = r.model[buffer->layout().params[i].param_index];
      buffer->GradView(i).copy_(Slice(WholeValue(g, step + 1).mul_(2.0), g, tp, tp_rank));
    }
  }
  Communicator& dp = r.mesh->dp();
  ASSIGN_OR_RETURN(auto works, buffers::LaunchGradSync(dp, r.buffers,
                                                       buffers::GradSync::kReduceScatter,
                                                       collectives::ReduceOp::kAvg));
  RETURN_IF_ERROR(buffers::WaitAll(works, dp.timeout()));
  RETURN_IF_ERROR(r.optimizer->Step().status());
  ASSIGN_OR_RETURN(works, buffers::LaunchParamSync(dp, r.buffers));
  return buffers::WaitAll(works, dp.timeout());
}

SharedState Shared(int64_t step) {
  SharedState s;
  s.step = step;
  s.data_position = absl::StrCat("position ", step);
  s.model_config = "tp-test";
  s.optimizer_config = "test";
  return s;
}

// Writes what this rank holds to `dir`/rank<world rank>.safetensors: "param|<name>" (its local
// param) and "state|<name>|<offset>|<full shape>" (each exported state piece).
absl::Status Dump(const std::string& dir, Rank& r, int world_rank) {
  std::vector<at::Tensor> keep;
  std::vector<TensorData> tensors;
  auto add = [&](std::string name, const at::Tensor& t) {
    keep.push_back(t.detach().contiguous().clone());
    const at::Tensor& c = keep.back();
    tensors.push_back({{std::move(name), c.scalar_type() == at::kLong ? "I64" : "F32",
                        c.sizes().vec()},
                       {static_cast<const uint8_t*>(c.data_ptr()), c.nbytes()}});
  };
  for (size_t i = 0; i < r.specs.size(); ++i) add("param|" + r.specs[i].name, r.params[i]);
  for (const optimizers::StateRecord& s : r.optimizer->ExportState()) {
    add(absl::StrCat("state|", s.name, "|", s.offset, "|", absl::StrJoin(s.full_shape, ",")),
        s.tensor);
  }
  return WriteSafetensorsFile(JoinPath(dir, absl::StrCat("rank", world_rank, ".safetensors")),
                              tensors)
      .status();
}

// "save": kSteps steps at `grid`, saved under `root`, dumped to `dump`. "load": loads `root` at
// `grid` (checking the shared state), dumped to `dump`; "resume": the same, one more step before
// the dump. "straight": kSteps + 1 steps, dumped.
absl::Status RunScenario(const std::string& scenario, const std::string& root,
                         const std::string& dump, const Grid& grid, Communicator& world) {
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, BuildRank(world, grid, Model()));
  if (scenario == "straight") {
    for (int step = 0; step <= kSteps; ++step) RETURN_IF_ERROR(TrainStep(*r, step));
  } else if (scenario == "save") {
    for (int step = 0; step < kSteps; ++step) RETURN_IF_ERROR(TrainStep(*r, step));
    RETURN_IF_ERROR(SaveDistributedCheckpoint(root, Shared(kSteps), r->buffers, *r->optimizer,
                                              world, {}, nullptr, r->tp));
  } else {
    ASSIGN_OR_RETURN(const SharedState loaded,
                     LoadDistributedCheckpoint(root, r->buffers, *r->optimizer, world, nullptr,
                                               r->tp));
    RETURN_IF_ERROR(Check(loaded.step == kSteps && loaded.data_position == "position 3" &&
                              r->optimizer->steps_taken() == kSteps,
                          absl::StrCat("loaded step ", loaded.step, ", optimizer steps ",
                                       r->optimizer->steps_taken())));
    if (scenario == "resume") RETURN_IF_ERROR(TrainStep(*r, kSteps));
  }
  return Dump(dump, *r, world.rank());
}

std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  if (!collectives::testing::InRankProcess()) {  // a later launch's ranks must find the files
    EXPECT_OK(RemoveRecursively(dir));
    EXPECT_OK(MakeDir(dir));
  }
  return dir;
}

at::Tensor TensorOf(const SafetensorsReader& reader, const TensorEntry& e) {
  absl::StatusOr<std::vector<uint8_t>> bytes = reader.ReadTensor(e.spec.name);
  EXPECT_OK(bytes.status());
  const at::ScalarType type = e.spec.dtype == "I64" ? at::kLong : at::kFloat;
  if (!bytes.ok()) return at::Tensor();
  return at::from_blob(bytes->data(), e.spec.shape, type).clone();
}

// The whole tensors a (tp, dp) run's dumps describe: "param <name>" and "state <name>", each
// rank's state assembled from its tp rank's pieces over every dp rank, the tp ranks' local
// tensors joined with Unslice (elementwise state of a split param) or required equal (the rest).
// Every dp copy of a param must be equal, too.
absl::StatusOr<std::map<std::string, at::Tensor>> WholeFromDumps(const std::string& dir,
                                                                 const Grid& grid) {
  std::map<std::string, GlobalParam> model;
  for (const GlobalParam& g : Model()) model[g.name] = g;
  // name -> tp rank -> local tensor (params); state name -> tp rank -> pieces.
  std::map<std::string, std::vector<at::Tensor>> params;
  std::map<std::string, std::vector<std::vector<optimizers::StateRecord>>> state;
  for (int w = 0; w < grid.tp * grid.dp; ++w) {
    const int tp_rank = w % grid.tp;
    ASSIGN_OR_RETURN(SafetensorsReader reader,
                     SafetensorsReader::Open(JoinPath(dir, absl::StrCat("rank", w,
                                                                         ".safetensors"))));
    for (const TensorEntry& e : reader.header().tensors) {
      const std::vector<std::string> f = absl::StrSplit(e.spec.name, '|');
      at::Tensor t = TensorOf(reader, e);
      if (f[0] == "param") {
        std::vector<at::Tensor>& locals = params[f[1]];
        locals.resize(grid.tp);
        if (locals[tp_rank].defined()) {
          RETURN_IF_ERROR(Check(at::equal(locals[tp_rank], t),
                                absl::StrCat(dir, ": dp copies of ", f[1], " differ")));
        }
        locals[tp_rank] = t;
        continue;
      }
      optimizers::StateRecord s;
      s.name = f[1];
      RETURN_IF_ERROR(Check(f.size() == 4 && absl::SimpleAtoi(f[2], &s.offset), e.spec.name));
      for (absl::string_view d : absl::StrSplit(f[3], ',', absl::SkipEmpty())) {
        int64_t v = 0;
        RETURN_IF_ERROR(Check(absl::SimpleAtoi(d, &v), e.spec.name));
        s.full_shape.push_back(v);
      }
      s.tensor = t.reshape({-1});
      auto& per_rank = state[s.name];
      per_rank.resize(grid.tp);
      per_rank[tp_rank].push_back(std::move(s));
    }
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, locals] : params) {
    out["param " + name] = Unslice(locals, model.at(name));
  }
  for (const auto& [name, per_rank] : state) {
    std::vector<at::Tensor> locals;
    for (int t = 0; t < grid.tp; ++t) {
      RETURN_IF_ERROR(Check(!per_rank[t].empty(), absl::StrCat(dir, ": no ", name, " on tp rank ",
                                                               t)));
      const optimizers::StateRecord& first = per_rank[t].front();
      int64_t numel = 1;
      for (int64_t d : first.full_shape) numel *= d;
      ASSIGN_OR_RETURN(at::Tensor whole,
                       optimizers::ReadStateRange(per_rank[t], name, first.full_shape, 0, numel,
                                                  first.tensor.scalar_type()));
      locals.push_back(whole.view(first.full_shape));
    }
    const size_t slash = name.rfind('/');
    const std::string param = slash == std::string::npos ? "" : name.substr(0, slash);
    const auto it = model.find(param);
    const bool split_state = it != model.end() && it->second.dim >= 0 && grid.tp > 1 &&
                             locals[0].sizes().vec() ==
                                 TpLocalShape(it->second.shape, SplitOf(it->second, grid.tp, 0));
    if (split_state) {
      out["state " + name] = Unslice(locals, it->second);
    } else {
      for (int t = 1; t < grid.tp; ++t) {
        RETURN_IF_ERROR(Check(at::equal(locals[t], locals[0]),
                              absl::StrCat(dir, ": ", name, " differs between tp ranks")));
      }
      out["state " + name] = locals[0];  // at tp 1, elementwise state is the whole tensor
    }
  }
  return out;
}

void ExpectSameWhole(const std::map<std::string, at::Tensor>& want,
                     const std::map<std::string, at::Tensor>& got, const std::string& label) {
  SCOPED_TRACE(label);
  int params = 0, states = 0;
  for (const auto& [name, t] : want) {
    const auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << label << " lacks " << name;
      continue;
    }
    params += name.rfind("param ", 0) == 0 ? 1 : 0;
    states += name.rfind("state ", 0) == 0 ? 1 : 0;
    EXPECT_TRUE(it->second.sizes() == t.sizes() && at::equal(it->second, t))
        << name << " differs in " << label;
  }
  EXPECT_EQ(want.size(), got.size());
  EXPECT_EQ(params, static_cast<int>(Model().size())) << "every param";
  // AdamW: exp_avg + exp_avg_sq per vector/embedding (3), Muon: momentum_buffer per matrix (3),
  // plus the optimizer's counters.
  EXPECT_GE(states, 9) << "every state tensor";
}

void RunJob(const std::string& scenario, const std::string& root, const std::string& dump,
            const Grid& grid) {
  collectives::testing::RunOnRanks(grid.tp * grid.dp, [&](Communicator& comm) {
    ASSERT_OK(RunScenario(scenario, root, dump, grid, comm));
  });
}

const std::vector<Grid> kLoadGrids = {{1, 4}, {4, 1}, {1, 1}, {2, 1}};

// Saves at `save` into fresh directories; returns (root, dump).
std::pair<std::string, std::string> SaveAt(const std::string& name, const Grid& save) {
  const std::string root = FreshDir(name + "_root"), dump = FreshDir(name + "_dump");
  RunJob("save", root, dump, save);
  return {root, dump};
}

TEST(TpCheckpointTest, SavedAtTp2Dp2LoadsAtAnyTpAndDp) {
  const auto [root, save_dump] = SaveAt("tp2dp2", {2, 2});
  std::map<std::string, at::Tensor> saved;
  if (!collectives::testing::InRankProcess()) {
    ASSERT_OK_AND_ASSIGN(saved, WholeFromDumps(save_dump, {2, 2}));
    // The state is not trivial: Muon momentum and AdamW moments after kSteps steps.
    ASSERT_EQ(saved.count("state layers.0.mlp.fc1.weight/momentum_buffer"), 1u);
    EXPECT_GT(saved.at("state layers.0.mlp.fc1.weight/momentum_buffer").abs().sum().item<float>(),
              0.0f);
    ASSERT_OK_AND_ASSIGN(const Manifest manifest, ReadManifest(JoinPath(root, "step_000003")));
    EXPECT_EQ(manifest.tp_size(), 2);
    EXPECT_EQ(manifest.dp_size(), 2);
  }
  for (const Grid& grid : kLoadGrids) {
    const std::string dump = FreshDir("tp2dp2_to_" + grid.Label());
    RunJob("load", root, dump, grid);
    if (collectives::testing::InRankProcess()) continue;
    ASSERT_OK_AND_ASSIGN(const auto loaded, WholeFromDumps(dump, grid));
    ExpectSameWhole(saved, loaded, "tp 2 x dp 2 loaded at " + grid.Label());
  }
}

// At the same tp the update of every param is the same at any dp (Muon on the same local slices,
// AdamW elementwise, gradients averaged exactly): a resume at tp 2 x dp 1 (and at the saving grid)
// continues bit for bit as the straight tp 2 x dp 2 run.
TEST(TpCheckpointTest, ResumeAtTp2ContinuesAsAStraightRun) {
  const auto [root, save_dump] = SaveAt("resume", {2, 2});
  const std::string straight = FreshDir("resume_straight");
  RunJob("straight", "", straight, {2, 2});
  for (const Grid& grid : {Grid{2, 1}, Grid{2, 2}}) {
    const std::string dump = FreshDir("resume_at_" + grid.Label());
    RunJob("resume", root, dump, grid);
    if (collectives::testing::InRankProcess()) continue;
    ASSERT_OK_AND_ASSIGN(const auto want, WholeFromDumps(straight, {2, 2}));
    ASSERT_OK_AND_ASSIGN(const auto got, WholeFromDumps(dump, grid));
    ExpectSameWhole(want, got, "resumed at " + grid.Label());
  }
}

TEST(TpCheckpointTest, SavedWithoutTpLoadsAtTp2) {
  const auto [root, save_dump] = SaveAt("tp1dp2", {1, 2});
  const std::string dump = FreshDir("tp1dp2_to_tp2_dp2");
  RunJob("load", root, dump, {2, 2});
  if (collectives::testing::InRankProcess()) return;
  ASSERT_OK_AND_ASSIGN(const auto saved, WholeFromDumps(save_dump, {1, 2}));
  ASSERT_OK_AND_ASSIGN(const auto loaded, WholeFromDumps(dump, {2, 2}));
  ASSERT_OK_AND_ASSIGN(CheckpointReader reader, CheckpointReader::Open(root));
  for (const TensorRecord& r : reader.manifest().tensors()) {
    EXPECT_FALSE(r.has_tp()) << r.name() << " (" << r.kind() << ")";
  }
  ExpectSameWhole(saved, loaded, "tp 1 x dp 2 loaded at tp 2 x dp 2");
}

// Rewrites the manifest of `from`'s latest step into a copy at `to`, without the records `drop`
// matches.
void CopyWithout(const std::string& from, const std::string& to,
                 const std::function<bool(const TensorRecord&)>& drop) {
  namespace fs = std::filesystem;
  ASSERT_OK(RemoveRecursively(to));
  fs::copy(from, to, fs::copy_options::recursive);
  const std::string dir = JoinPath(to, "step_000003");
  ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir));
  Manifest kept = manifest;
  kept.clear_tensors();
  int dropped = 0;
  for (const TensorRecord& r : manifest.tensors()) {
    if (drop(r)) {
      ++dropped;
    } else {
      *kept.add_tensors() = r;
    }
  }
  ASSERT_GT(dropped, 0);
  ASSERT_OK(WriteManifest(dir, kept));
}

TEST(TpCheckpointTest, RefusesOtherShapesAndMissingSlices) {
  const auto [root, dump] = SaveAt("refusals", {2, 2});
  const std::string no_param_slice = JoinPath(::testing::TempDir(), "refusals_no_param_slice");
  const std::string no_state_slice = JoinPath(::testing::TempDir(), "refusals_no_state_slice");
  if (!collectives::testing::InRankProcess()) {
    CopyWithout(root, no_param_slice, [](const TensorRecord& r) {
      return r.name() == "layers.0.attn.qkv.weight" && r.kind() == TpParamKind(1);
    });
    CopyWithout(root, no_state_slice, [](const TensorRecord& r) {
      return r.name() == "layers.0.attn.qkv.bias/exp_avg" && r.has_tp() && r.tp().rank() == 1;
    });
  }
  collectives::testing::RunOnRanks(1, [&](Communicator& world) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rank> r, BuildRank(world, {1, 1}, Model(12)));
    EXPECT_THAT(LoadDistributedCheckpoint(root, r->buffers, *r->optimizer, world, nullptr, r->tp),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("param 'layers.0.mlp.fc1.weight' is F32 [16,8], the model "
                                   "expects F32 [16,12]")));
    ASSERT_OK_AND_ASSIGN(r, BuildRank(world, {1, 1}, Model()));
    EXPECT_THAT(
        LoadDistributedCheckpoint(no_param_slice, r->buffers, *r->optimizer, world, nullptr,
                                  r->tp),
        StatusIs(absl::StatusCode::kDataLoss,
                 HasSubstr("param 'layers.0.attn.qkv.weight' is split over tp 2 (dim 0, 1 part, "
                           "rank 0 of 2) but no record holds its slice for tp rank 1")));
    EXPECT_THAT(
        LoadDistributedCheckpoint(no_state_slice, r->buffers, *r->optimizer, world, nullptr,
                                  r->tp),
        StatusIs(absl::StatusCode::kNotFound,
                 HasSubstr("state tensor 'layers.0.attn.qkv.bias/exp_avg': its saved tp slices "
                           "hold 100 of the 200 elements")));
    // Nothing live changed: the params are still the fresh model's.
    const GlobalParam qkv = Model()[1];
    EXPECT_TRUE(at::equal(r->params[1], WholeValue(qkv, 0)));
  });
  // At tp 2 rank 0 needs only saved tp rank 0's slice of the bias state: it loads, rank 1 names
  // the missing one, so neither changes anything.
  collectives::testing::RunOnRanks(2, [&](Communicator& world) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rank> r, BuildRank(world, {2, 1}, Model()));
    const absl::StatusOr<SharedState> loaded =
        LoadDistributedCheckpoint(no_state_slice, r->buffers, *r->optimizer, world, nullptr, r->tp);
    if (world.rank() == 1) {
      EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kNotFound, HasSubstr("qkv.bias/exp_avg")));
    } else {
      EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kAborted, HasSubstr("another rank")));
    }
  });
}

// A save whose tp rank 1 does not know fc1 is split (so writes no slice of it) is not committed.
TEST(TpCheckpointTest, CommitRefusesAMissingSlice) {
  const std::string root = FreshDir("missing_slice_root");
  collectives::testing::RunOnRanks(2, [&](Communicator& world) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rank> r, BuildRank(world, {2, 1}, Model()));
    ASSERT_OK(TrainStep(*r, 0));
    TensorParallelism tp = r->tp;
    if (tp.rank == 1) tp.splits.erase("layers.0.mlp.fc1.weight");
    const absl::Status saved =
        SaveDistributedCheckpoint(root, Shared(1), r->buffers, *r->optimizer, world, {}, nullptr,
                                  tp);
    if (world.rank() == 0) {
      EXPECT_THAT(saved, StatusIs(absl::StatusCode::kInternal,
                                  HasSubstr("param 'layers.0.mlp.fc1.weight' is split over tp 2 "
                                            "(dim 0, 2 parts, rank 0 of 2) but no record holds "
                                            "its slice for tp rank 1")));
    } else {
      EXPECT_THAT(saved, StatusIs(absl::StatusCode::kAborted, HasSubstr("commit")));
    }
  });
  if (collectives::testing::InRankProcess()) return;
  ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> steps, ListCheckpoints(root));
  EXPECT_TRUE(steps.empty());
  ASSERT_OK_AND_ASSIGN(const bool has_latest, PathExists(JoinPath(root, "latest")));
  EXPECT_FALSE(has_latest);
}

// The whole-tensor readers of a tp 2 checkpoint (ckpt forward's CheckpointReader::Read, ckpt
// export) give the whole tensors the save held; ckpt inspect shows each param's split.
TEST(TpCheckpointTest, WholeTensorReadersAssembleTpSlices) {
  const auto [root, dump] = SaveAt("whole", {2, 2});
  if (collectives::testing::InRankProcess()) return;
  ASSERT_OK_AND_ASSIGN(const auto saved, WholeFromDumps(dump, {2, 2}));
  ASSERT_OK_AND_ASSIGN(CheckpointReader reader, CheckpointReader::Open(root));
  EXPECT_EQ(reader.params().size(), Model().size());
  const std::string out = FreshDir("whole_export");
  ASSERT_OK(ExportSafetensors(reader.dir(), out).status());
  ASSERT_OK_AND_ASSIGN(SafetensorsReader exported,
                       SafetensorsReader::Open(JoinPath(out, "model.safetensors")));
  for (const GlobalParam& g : Model()) {
    SCOPED_TRACE(g.name);
    const at::Tensor& want = saved.at("param " + g.name);
    at::Tensor got = at::empty(g.shape, at::kFloat);
    ASSERT_OK(reader.Read(g.name, kParamKind, "F32", g.shape,
                          absl::MakeSpan(static_cast<uint8_t*>(got.data_ptr()), got.nbytes())));
    EXPECT_TRUE(at::equal(got, want));
    const TensorEntry* e = exported.Find(g.name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->spec.shape, g.shape);
    EXPECT_TRUE(at::equal(TensorOf(exported, *e), want));
  }
  std::ostringstream inspect;
  CkptCommand command;
  command.dir = root;
  ASSERT_OK(RunCkptCommand(command, inspect));
  EXPECT_THAT(inspect.str(),
              HasSubstr("layers.0.mlp.fc1.weight: F32 [16,8], tp 2: dim 0, 2 parts"));
  EXPECT_THAT(inspect.str(), HasSubstr("layers.0.mlp_norm.weight: F32 [8], replicated"));
}

}  // namespace
}  // namespace orthoshard::checkpoint
