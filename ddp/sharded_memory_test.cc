// The transient memory of sharded residency (ZeRO-3) with real Gloo ranks: a GPT-like stack (a tied
// embedding read by layer 0 and by the head, blocks of a Muon matrix and an Adam gain) at two
// depths. Checks, at 1 and 2 ranks: the transient peak of a step stays within the bound of
// distributed_data_parallel.h (TransientBoundOf), the same bound at both depths, well below the
// whole buffers of the deeper model; the tied embedding's group is released after the head's
// backward and gathered again for layer 0's; the grad shards are bitwise those of full residency;
// and sharded grad accumulation (GradAccumulation::kSharded) is bitwise full accumulation at one
// micro-batch, within the derived bound at three, and keeps the peak within the bound where full
// accumulation holds the whole grad buffer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "ddp/distributed_data_parallel.h"
#include "gtest/gtest.h"
#include "layout/layout.h"

namespace orthoshard::ddp {
namespace {

using collectives::Communicator;
using layout::ParamRole;
using layout::ParamSpec;

constexpr int64_t kBatch = 4;   // tokens per micro-batch
constexpr int64_t kWidth = 16;  // C
constexpr int64_t kVocab = 48;  // V

// params: emb [V, C] (layer 0, read by the head too), per block l = 1..depth: w [C, C] (Muon) and
// g [C] (Adam), head.g [C] (layer depth + 1); untied: the head's own out [V, C] after head.g.
struct Stack {
  int depth = 0;
  std::vector<ParamSpec> specs;
  std::vector<int> layers;
  bool tied = true;
  int64_t bucket_size = 64;           // layout::LayoutOptions::bucket_size
  bool isolate_large_params = false;  // layout::LayoutOptions::isolate_large_params
  int head() const { return depth + 1; }
};

ParamSpec Spec(std::string name, std::vector<int64_t> shape, ParamRole role) {
  ParamSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.dtype = DType::kFloat32;
  spec.role = role;
  return spec;
}

Stack MakeStack(int depth) {
  Stack s;
  s.depth = depth;
  s.specs.push_back(Spec("emb", {kVocab, kWidth}, ParamRole::kAdam));
  s.specs.back().shared_embedding = true;
  s.layers.push_back(0);
  for (int l = 1; l <= depth; ++l) {
    s.specs.push_back(Spec(absl::StrCat("b", l, ".w"), {kWidth, kWidth}, ParamRole::kMuon));
    s.specs.push_back(Spec(absl::StrCat("b", l, ".g"), {kWidth}, ParamRole::kAdam));
    s.layers.insert(s.layers.end(), {l, l});
  }
  s.specs.push_back(Spec("head.g", {kWidth}, ParamRole::kAdam));
  s.layers.push_back(depth + 1);
  return s;
}

// The stack with an untied head, whose AdamW buffer holds (in backprop order) out, head.g, every
// block's gain and emb, and a bucket size between all the gains together ((depth + 1) x 64
// elements, each gain 64-aligned) and emb's V x C = 768 elements: Megatron's packing puts every
// gain in emb's bucket.
Stack MakeUntiedStack(int depth, bool isolate_large_params) {
  Stack s = MakeStack(depth);
  s.specs[0].shared_embedding = false;
  s.specs.push_back(Spec("out", {kVocab, kWidth}, ParamRole::kAdam));
  s.layers.push_back(depth + 1);
  s.tied = false;
  s.bucket_size = 512;
  s.isolate_large_params = isolate_large_params;
  return s;
}

std::vector<at::Tensor> MakeParams(const Stack& s) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < s.specs.size(); ++i) {
    params.push_back(at::arange(s.specs[i].numel(), at::kFloat)
                         .mul(0.37)
                         .add(0.7 * i)
                         .sin()
                         .mul(0.5)
                         .reshape(s.specs[i].shape)
                         .clone()
                         .set_requires_grad(true));
  }
  return params;
}

// Called with each layer's index after its pre-forward hook, before it computes.
using LayerObserver = std::function<void(int layer)>;

at::Tensor RunLayer(const LayerHooks* hooks, int layer, const std::function<at::Tensor()>& body,
                    const LayerObserver* observe = nullptr) {
  if (hooks != nullptr) hooks->pre_forward(layer);
  if (observe != nullptr) (*observe)(layer);
  at::Tensor out = body();
  if (hooks != nullptr) hooks->post_forward(layer, out);
  return out;
}

// Sum of (logits - 0.1)^2 over this rank's micro-batch `micro`, divided by `norm`.
at::Tensor Loss(const Stack& s, const std::vector<at::Tensor>& p, int rank, int micro, double norm,
                const LayerHooks* hooks, const LayerObserver* observe = nullptr) {
  const at::Tensor tokens = at::arange(kBatch, at::kLong)
                                .mul(5 + 2 * rank + 3 * micro)
                                .add(rank + micro)
                                .remainder(kVocab);
  at::Tensor h = RunLayer(
      hooks, 0, [&] { return at::index_select(p[0], 0, tokens); }, observe);  // [B, C]
  for (int l = 1; l <= s.depth; ++l) {
    h = RunLayer(
        hooks, l, [&] { return h.mm(p[2 * l - 1].t()).tanh().mul(p[2 * l]).add(h); }, observe);
  }
  const at::Tensor& gain = p[2 * s.depth + 1];
  const at::Tensor& out = s.tied ? p[0] : p.back();
  const at::Tensor logits =  // [B, V]
      RunLayer(hooks, s.head(), [&] { return h.mul(gain).mm(out.t()); }, observe);
  return logits.sub(0.1).pow(2).sum().div(norm);
}

layout::FullParamLayout Plan(const Stack& s, int world) {
  layout::LayoutOptions options;
  options.dp = world;
  options.bucket_size = s.bucket_size;
  options.isolate_large_params = s.isolate_large_params;
  absl::StatusOr<layout::FullParamLayout> plan = layout::ComputeFullParamLayout(s.specs, options);
  EXPECT_OK(plan.status());
  return *plan;
}

struct Run {
  std::vector<at::Tensor> params;
  std::vector<SyncEvent> events;
  std::unique_ptr<DistributedDataParallel> ddp;
  LayerHooks hooks;
};

// `lookup`: layer 0 (the embedding lookup) is a lookup layer of MakeLayerHooks.
absl::StatusOr<std::unique_ptr<Run>> MakeRun(const Stack& s, Communicator& comm, DdpConfig config,
                                             bool lookup = false) {
  auto run = std::make_unique<Run>();
  run->params = MakeParams(s);
  Run* raw = run.get();
  config.on_event = [raw](const SyncEvent& e) { raw->events.push_back(e); };
  ASSIGN_OR_RETURN(run->ddp, DistributedDataParallel::Create(Plan(s, comm.size()), run->params,
                                                             &comm, nullptr, config));
  ASSIGN_OR_RETURN(run->hooks,
                   run->ddp->MakeLayerHooks(s.layers,
                                            s.tied ? std::vector<std::pair<int, int>>{{0, s.head()}}
                                                   : std::vector<std::pair<int, int>>{},
                                            lookup ? std::vector<int>{0} : std::vector<int>{}));
  return run;
}

DdpConfig Sharded(GradAccumulation accumulation = GradAccumulation::kFull) {
  DdpConfig config;
  config.residency = buffers::Residency::kSharded;
  config.grad_accumulation = accumulation;
  return config;
}

// One step of `micro` micro-batches (the hooks run only with sharded residency).
absl::Status Step(const Stack& s, Run& run, int rank, int micro) {
  run.ddp->ZeroGradBuffers();
  run.ddp->ResetPeakMemory();
  run.events.clear();
  const bool sharded = run.ddp->buffer(0).residency() == buffers::Residency::kSharded;
  for (int m = 0; m < micro; ++m) {
    run.ddp->set_is_last_microbatch(m == micro - 1);
    Loss(s, run.params, rank, m, kBatch * micro, sharded ? &run.hooks : nullptr).backward();
  }
  RETURN_IF_ERROR(run.ddp->FinishGradSync());
  return run.ddp->bucket_groups().StartParamSync();
}

// Full param and grad bytes of every buffer (what kFull residency holds).
int64_t WholeBytes(const DistributedDataParallel& ddp) {
  int64_t n = 0;
  for (int b = 0; b < ddp.num_buffers(); ++b) n += ddp.buffer(b).layout().numel() * (4 + 4);
  return n;
}

// This rank's grad shards of `a` and `b` per element: |a - b| <= factor * scale, or bitwise equal
// when factor is 0; `scale` is per param (flat), mapped onto the shards.
absl::Status CompareShards(const DistributedDataParallel& a, const DistributedDataParallel& b,
                           int rank, double factor, const std::vector<at::Tensor>& scale,
                           const std::string& what) {
  for (int i = 0; i < a.num_buffers(); ++i) {
    const layout::PerBufferParamLayout& lay = a.buffer(i).layout();
    for (int k = 0; k < a.buffer(i).num_buckets(); ++k) {
      const at::Tensor x = a.buffer(i).GradShard(k, rank), y = b.buffer(i).GradShard(k, rank);
      if (factor == 0) {
        if (!at::equal(x, y)) {
          return absl::InternalError(absl::StrCat(what, ": buffer ", i, " bucket ", k,
                                                  " differs, expected bitwise equality"));
        }
        continue;
      }
      const auto [s, e] = lay.ShardRange(k, rank);
      at::Tensor bound = at::zeros({e - s}, at::kFloat);
      for (const layout::ParamPlacement& p : lay.params) {
        const int64_t lo = std::max(s, p.start), hi = std::min(e, p.end);
        if (lo < hi) {
          bound.narrow(0, lo - s, hi - lo)
              .copy_(scale[p.param_index].narrow(0, lo - p.start, hi - lo).mul(factor));
        }
      }
      const at::Tensor diff = x.sub(y).abs();
      if (!diff.le(bound).all().item<bool>()) {
        return absl::InternalError(absl::StrCat(what, ": buffer ", i, " bucket ", k, " max |diff| ",
                                                diff.max().item<double>(), " over the bound"));
      }
    }
  }
  return absl::OkStatus();
}

// sum over ranks r and micro-batches m of |g_mr * fl(1/world)| per param, recomputed locally (the
// same ops as every rank's backward).
std::vector<at::Tensor> AbsTermSums(const Stack& s, int world, int micro) {
  std::vector<at::Tensor> sums;
  for (const ParamSpec& spec : s.specs) sums.push_back(at::zeros({spec.numel()}, at::kFloat));
  const float scale = 1.0f / static_cast<float>(world);
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < micro; ++m) {
      std::vector<at::Tensor> params = MakeParams(s);
      Loss(s, params, r, m, kBatch * micro, nullptr).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        sums[i].add_(params[i].grad().flatten().mul(scale).abs());
      }
    }
  }
  return sums;
}

// A step of `s` at sharded residency with `in_flight` grad syncs left in flight: peak within the
// bound, grads bitwise those of full residency, the tied embedding released after the head's
// backward and gathered again for layer 0's (not at all with `lookup`). Returns the bound.
absl::StatusOr<TransientBound> CheckBoundedStep(const Stack& s, Communicator& comm, int in_flight,
                                                bool lookup) {
  const int rank = comm.rank();
  DdpConfig config = Sharded();
  config.grad_syncs_in_flight = in_flight;
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(s, comm, config, lookup));
  ASSIGN_OR_RETURN(std::unique_ptr<Run> full, MakeRun(s, comm, DdpConfig{}));
  ASSIGN_OR_RETURN(const TransientBound bound, run->ddp->TransientBoundOf());
  for (int step = 0; step < 2; ++step) {
    RETURN_IF_ERROR(Step(s, *run, rank, 1));
    RETURN_IF_ERROR(Step(s, *full, rank, 1));
    RETURN_IF_ERROR(CompareShards(*run->ddp, *full->ddp, rank, 0, {}, "sharded vs full"));
  }
  const int64_t peak = run->ddp->memory().peak_transient_bytes;
  std::printf(
      "depth %d in flight %d lookup %d rank %d: transient peak %lld, bound %lld (params "
      "%lld, grads %lld, grad syncs %lld), whole buffers %lld\n",
      s.depth, in_flight, lookup, rank, static_cast<long long>(peak),
      static_cast<long long>(bound.total()), static_cast<long long>(bound.params),
      static_cast<long long>(bound.grads), static_cast<long long>(bound.grad_syncs),
      static_cast<long long>(WholeBytes(*run->ddp)));
  if (peak <= 0 || peak > bound.total()) {
    return absl::InternalError(absl::StrCat("depth ", s.depth, ": transient peak ", peak,
                                            " bytes, expected in (0, ", bound.total(), "]"));
  }
  // The embedding's group: released at the head's backward's end (the hook before layer `depth`'s
  // backward), then gathered again (prefetched before layer 1's backward, waited before layer 0's).
  const std::pair<int, const layout::ParamPlacement*> emb = Plan(s, comm.size()).Find("emb");
  const int emb_group = run->ddp->bucket_groups().GroupOfBucket(emb.first, emb.second->bucket);
  int released_at_head = -1, gathers_after = 0;
  for (size_t i = 0; i < run->events.size(); ++i) {
    const SyncEvent& e = run->events[i];
    if (e.buffer != emb.first || e.group != emb_group) continue;
    if (e.kind == SyncEvent::Kind::kParamsReleased && e.layer == s.depth && released_at_head < 0)
      released_at_head = static_cast<int>(i);
    if (e.kind == SyncEvent::Kind::kParamGatherWaited && released_at_head >= 0) ++gathers_after;
  }
  if (released_at_head < 0 || gathers_after != (lookup ? 0 : 1)) {
    return absl::InternalError(absl::StrCat(
        "depth ", s.depth, ": the embedding's group was ",
        released_at_head < 0
            ? "not released after the head's backward"
            : absl::StrCat("gathered ", gathers_after,
                           " times after the head's backward, expected ", lookup ? 0 : 1)));
  }
  return bound;
}

// Sharded grad accumulation: bitwise full accumulation at one micro-batch; at three within
// (gamma_{M+dp-1} + gamma_{M*dp+1}) sum |t_mr| (GradAccumulation), the peak within the bound
// where full accumulation holds every grad bucket at once.
absl::Status CheckShardedAccumulation(const Stack& s, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  for (const int micro : {1, 3}) {
    ASSIGN_OR_RETURN(std::unique_ptr<Run> full, MakeRun(s, comm, Sharded()));
    ASSIGN_OR_RETURN(std::unique_ptr<Run> acc,
                     MakeRun(s, comm, Sharded(GradAccumulation::kSharded)));
    RETURN_IF_ERROR(Step(s, *full, rank, micro));
    RETURN_IF_ERROR(Step(s, *acc, rank, micro));
    const double u = std::ldexp(1.0, -24);
    auto gamma = [u](int k) { return k * u / (1 - k * u); };
    const double factor = micro == 1 ? 0 : gamma(micro + world - 1) + gamma(micro * world + 1);
    RETURN_IF_ERROR(
        CompareShards(*acc->ddp, *full->ddp, rank, factor, AbsTermSums(s, world, micro),
                      absl::StrCat("sharded vs full accumulation, ", micro, " micro-batches")));
    ASSIGN_OR_RETURN(const TransientBound bound, acc->ddp->TransientBoundOf());
    const int64_t peak = acc->ddp->memory().peak_transient_bytes;
    const int64_t full_peak = full->ddp->memory().peak_transient_bytes;
    std::printf("micro %d rank %d: peak %lld (sharded accumulation), %lld (full), bound %lld\n",
                micro, rank, static_cast<long long>(peak), static_cast<long long>(full_peak),
                static_cast<long long>(bound.total()));
    if (peak > bound.total()) {
      return absl::InternalError(absl::StrCat("sharded accumulation, ", micro,
                                              " micro-batches: peak ", peak, " over the bound ",
                                              bound.total()));
    }
    int64_t grad_bytes = 0;  // every full grad bucket: what full accumulation keeps from m = 0
    for (int b = 0; b < full->ddp->num_buffers(); ++b)
      grad_bytes += full->ddp->buffer(b).layout().numel() * 4;
    if (micro > 1 && full_peak < grad_bytes) {
      return absl::InternalError(absl::StrCat("full accumulation peaked at ", full_peak,
                                              ", expected at least the grad buffers' ",
                                              grad_bytes));
    }
  }
  // Full residency has no shards to accumulate into.
  std::vector<at::Tensor> params = MakeParams(s);
  DdpConfig config;
  config.grad_accumulation = GradAccumulation::kSharded;
  auto refused = DistributedDataParallel::Create(Plan(s, world), params, &comm, nullptr, config);
  if (refused.ok() || refused.status().code() != absl::StatusCode::kInvalidArgument ||
      !absl::StrContains(refused.status().message(), "needs sharded residency")) {
    return absl::InternalError(absl::StrCat("sharded accumulation with full residency gave ",
                                            refused.status().ToString()));
  }
  config = Sharded();
  config.grad_syncs_in_flight = -1;
  auto negative = DistributedDataParallel::Create(Plan(s, world), params, &comm, nullptr, config);
  if (negative.ok() || !absl::StrContains(negative.status().message(),
                                          "grad_syncs_in_flight must be >= 0, got -1")) {
    return absl::InternalError(
        absl::StrCat("grad_syncs_in_flight -1 gave ", negative.status().ToString()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(s, comm, Sharded()));
  const absl::StatusOr<LayerHooks> bad_lookup =
      run->ddp->MakeLayerHooks(s.layers, {}, {s.head() + 1});
  if (bad_lookup.ok() || bad_lookup.status().code() != absl::StatusCode::kInvalidArgument ||
      !absl::StrContains(bad_lookup.status().message(),
                         "lookup layer 5, expected a layer in [0, 5)")) {
    return absl::InternalError(
        absl::StrCat("lookup layer out of range gave ", bad_lookup.status().ToString()));
  }
  return absl::OkStatus();
}

// What one sharded step of an untied stack held: per forward layer, whether emb's bucket group
// was gathered (launched or waited, not yet released) while the layer ran, and the transient
// bytes then; and the step's transient peak.
struct UntiedStep {
  std::vector<bool> embedding_gathered;  // [layer]
  std::vector<int64_t> transient_bytes;  // [layer]
  int64_t peak = 0;
};

absl::StatusOr<UntiedStep> RunUntiedStep(const Stack& s, Communicator& comm) {
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(s, comm, Sharded(), /*lookup=*/true));
  const std::pair<int, const layout::ParamPlacement*> emb = Plan(s, comm.size()).Find("emb");
  const int emb_group = run->ddp->bucket_groups().GroupOfBucket(emb.first, emb.second->bucket);
  UntiedStep out;
  const LayerObserver observe = [&](int layer) {
    bool gathered = false;
    for (const SyncEvent& e : run->events) {
      if (e.buffer != emb.first || e.group != emb_group) continue;
      if (e.kind == SyncEvent::Kind::kParamGatherLaunched ||
          e.kind == SyncEvent::Kind::kParamGatherWaited) {
        gathered = true;
      } else if (e.kind == SyncEvent::Kind::kParamsReleased) {
        gathered = false;
      }
    }
    out.embedding_gathered.resize(layer + 1);
    out.transient_bytes.resize(layer + 1);
    out.embedding_gathered[layer] = gathered;
    out.transient_bytes[layer] = run->ddp->memory().transient_bytes;
  };
  run->ddp->ZeroGradBuffers();
  run->ddp->ResetPeakMemory();
  run->ddp->set_is_last_microbatch(true);
  Loss(s, run->params, comm.rank(), 0, kBatch, &run->hooks, &observe).backward();
  RETURN_IF_ERROR(run->ddp->FinishGradSync());
  RETURN_IF_ERROR(run->ddp->bucket_groups().StartParamSync());
  out.peak = run->ddp->memory().peak_transient_bytes;
  return out;
}

// An untied embedding (TinyLlama's case): Megatron's packing puts every block's gain in the
// embedding's bucket, so every block's forward holds the embedding gathered;
// isolate_large_params gives it (and the head's out) a bucket of its own, gathered for layer 0's
// forward only, and each block's forward then holds at least the embedding's fp32 bytes less
// (the gains' bucket loses exactly emb's 768 elements here: every offset is a multiple of 128),
// and so does the step's peak (the head's backward prefetches the gains' group).
TEST(ShardedMemoryUntiedTest, ABlocksForwardGathersNoUntiedEmbedding) {
  for (const int world : {1, 2}) {
    collectives::testing::RunOnRanks(world, [](Communicator& comm) {
      constexpr int kDepth = 4;
      ASSERT_OK_AND_ASSIGN(const UntiedStep packed,
                           RunUntiedStep(MakeUntiedStack(kDepth, false), comm));
      ASSERT_OK_AND_ASSIGN(const UntiedStep isolated,
                           RunUntiedStep(MakeUntiedStack(kDepth, true), comm));
      ASSERT_EQ(packed.embedding_gathered.size(), kDepth + 2u);
      ASSERT_EQ(isolated.embedding_gathered.size(), kDepth + 2u);
      EXPECT_TRUE(isolated.embedding_gathered[0]);
      constexpr int64_t kEmbeddingBytes = kVocab * kWidth * 4;
      for (int l = 1; l <= kDepth; ++l) {
        EXPECT_TRUE(packed.embedding_gathered[l]) << "layer " << l;
        EXPECT_FALSE(isolated.embedding_gathered[l]) << "layer " << l;
        EXPECT_LE(isolated.transient_bytes[l] + kEmbeddingBytes, packed.transient_bytes[l])
            << "layer " << l;
      }
      std::printf("rank %d of %d: transient peak %lld packed, %lld isolated\n", comm.rank(),
                  comm.size(), static_cast<long long>(packed.peak),
                  static_cast<long long>(isolated.peak));
      EXPECT_LE(isolated.peak + kEmbeddingBytes, packed.peak);
    });
  }
}

class ShardedMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedMemoryTest, PeakWithinTheStatedBoundAtEveryDepth) {
  collectives::testing::RunOnRanks(GetParam(), [](Communicator& comm) {
    const Stack deep_stack = MakeStack(16);
    for (const int in_flight : {0, 1, 2}) {
      for (const bool lookup : {false, true}) {
        ASSERT_OK_AND_ASSIGN(const TransientBound shallow,
                             CheckBoundedStep(MakeStack(2), comm, in_flight, lookup));
        ASSERT_OK_AND_ASSIGN(const TransientBound deep,
                             CheckBoundedStep(deep_stack, comm, in_flight, lookup));
        // Independent of depth: the same layers give the same bound.
        EXPECT_EQ(deep.total(), shallow.total()) << in_flight << " " << lookup;
      }
    }
    DdpConfig defaults;
    ASSERT_OK_AND_ASSIGN(const TransientBound deep,
                         CheckBoundedStep(deep_stack, comm, defaults.grad_syncs_in_flight, true));
    std::vector<at::Tensor> params = MakeParams(deep_stack);
    ASSERT_OK_AND_ASSIGN(
        auto ddp, DistributedDataParallel::Create(Plan(deep_stack, comm.size()), params, &comm,
                                                  nullptr, Sharded()));
    EXPECT_LT(2 * deep.total(), WholeBytes(*ddp));
    ASSERT_OK(CheckShardedAccumulation(MakeStack(3), comm));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedMemoryTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::ddp
