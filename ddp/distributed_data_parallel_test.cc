// DistributedDataParallel with real Gloo ranks: 1, 2, 3 and 4 processes (the multi-rank harness),
// each checking grad sync and grad accumulation over micro-batches against mean gradients recomputed
// locally as the ranks compute them (bitwise at 1 and 2 ranks, within the bound of another
// cross-rank summation order at 3 and 4), overlap on vs off (bitwise), the all-reduce grad sync of
// replicated optimizers (the whole mean on every rank, no param sync), param sync with and without
// overlap (and the order of the pre-forward hook's waits and launches), dp larger than the number
// of params, and the timeout error, in phases run in order on every rank. Each phase builds a small model (matmuls of at:: ops over params of varied shapes and dtypes,
// including bf16 params with fp32 grads and an expert matrix on its own communicator), computes
// locally every rank's gradients on that rank's micro-batches as the reference, and checks what DDP
// produced.
#include "ddp/distributed_data_parallel.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "layout/layout.h"

namespace orthoshard::ddp {
namespace {

using collectives::Communicator;
using layout::ParamRole;
using layout::ParamSpec;

constexpr int64_t kBatch = 4;  // samples per micro-batch

// Runs layer `layer` of a forward: the hooks (may be null) around `body`, which returns the
// layer's output.
at::Tensor RunLayer(const LayerHooks* hooks, int layer, const std::function<at::Tensor()>& body) {
  if (hooks != nullptr && hooks->pre_forward) hooks->pre_forward(layer);
  at::Tensor out = body();
  if (hooks != nullptr && hooks->post_forward) hooks->post_forward(layer, out);
  return out;
}

struct Model {
  std::vector<ParamSpec> specs;  // forward order
  std::vector<int> layers;       // layer of each param
  int64_t in_features = 0;
  // The output for input x; calls the hooks (may be null) around each layer.
  std::function<at::Tensor(const std::vector<at::Tensor>&, const at::Tensor&, const LayerHooks*)>
      forward;
};

at::Tensor Pattern(int64_t n, double phase, double freq) {
  return at::arange(n, at::kFloat).mul(freq).add(phase).sin();
}

ParamSpec Spec(std::string name, std::vector<int64_t> shape, DType dtype, ParamRole role,
               bool expert = false) {
  ParamSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.dtype = dtype;
  spec.role = role;
  spec.expert = expert;
  return spec;
}

// Four layers: fp32 matrix + bias, bf16 matrix + bias (bf16 matmul), an expert matrix, a head.
Model MainModel() {
  Model m;
  m.specs = {Spec("l0.w", {24, 16}, DType::kFloat32, ParamRole::kMuon),
             Spec("l0.b", {24}, DType::kFloat32, ParamRole::kAdam),
             Spec("l1.w", {32, 24}, DType::kBFloat16, ParamRole::kMuon),
             Spec("l1.b", {32}, DType::kBFloat16, ParamRole::kAdam),
             Spec("l2.w", {40, 32}, DType::kFloat32, ParamRole::kMuon, /*expert=*/true),
             Spec("l3.w", {8, 40}, DType::kFloat32, ParamRole::kAdam),
             Spec("l3.g", {8}, DType::kFloat32, ParamRole::kAdam)};
  m.layers = {0, 0, 1, 1, 2, 3, 3};
  m.in_features = 16;
  m.forward = [](const std::vector<at::Tensor>& p, const at::Tensor& x, const LayerHooks* h) {
    at::Tensor h0 = RunLayer(h, 0, [&] { return x.mm(p[0].t()).add(p[1]).tanh(); });  // [B, 24]
    at::Tensor h1 = RunLayer(h, 1, [&] {                                              // [B, 32]
      return h0.to(at::kBFloat16).mm(p[2].t()).add(p[3]).to(at::kFloat).tanh();
    });
    at::Tensor h2 = RunLayer(h, 2, [&] { return h1.mm(p[4].t()).tanh(); });  // [B, 40]
    return RunLayer(h, 3, [&] { return h2.mm(p[5].t()).mul(p[6]); });        // [B, 8]
  };
  return m;
}

// One Muon matrix and a bias: at 3 and 4 ranks, dp exceeds the number of Muon matrices.
Model TinyModel() {
  Model m;
  m.specs = {Spec("t.w", {3, 5}, DType::kFloat32, ParamRole::kMuon),
             Spec("t.b", {3}, DType::kFloat32, ParamRole::kAdam)};
  m.layers = {0, 0};
  m.in_features = 5;
  m.forward = [](const std::vector<at::Tensor>& p, const at::Tensor& x, const LayerHooks* h) {
    return RunLayer(h, 0, [&] { return x.mm(p[0].t()).add(p[1]); });
  };
  return m;
}

std::vector<at::Tensor> MakeParams(const Model& model) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < model.specs.size(); ++i) {
    const ParamSpec& spec = model.specs[i];
    params.push_back(Pattern(spec.numel(), 0.7 * i, 0.37)
                         .mul(0.5)
                         .reshape(spec.shape)
                         .to(buffers::ToScalarType(spec.dtype))
                         .clone()
                         .set_requires_grad(true));
  }
  return params;
}

at::Tensor Input(const Model& model, int rank, int micro) {
  return Pattern(kBatch * model.in_features, 1.3 * rank + 0.71 * micro + 0.1, 0.53)
      .reshape({kBatch, model.in_features});
}

// Sum over samples of (out - 0.1)^2, divided by `norm` (the samples of the whole step).
at::Tensor Loss(const Model& model, const std::vector<at::Tensor>& params, const at::Tensor& x,
                double norm, const LayerHooks* hooks = nullptr) {
  return model.forward(params, x, hooks).sub(0.1).pow(2).sum().div(norm);
}

// The mean gradient as `world` ranks of `micro` micro-batches compute it, per param as flat fp32:
// each rank's micro-batches backward one at a time, accumulated in fp32 as the grad buffer does
// (a bf16 param's gradient promoted), times 1/world as DDP pre-scales (x_r), summed in rank order;
// and sum_r |x_r|, the scale of the bound on another summation order (CheckGradShards).
struct ReferenceGrads {
  std::vector<at::Tensor> mean;
  std::vector<at::Tensor> abs_sum;
};
ReferenceGrads ReferenceMeanGrads(const Model& model, int world, int micro) {
  ReferenceGrads ref;
  for (int r = 0; r < world; ++r) {
    std::vector<at::Tensor> params = MakeParams(model);
    std::vector<at::Tensor> acc;
    for (const at::Tensor& p : params) acc.push_back(at::zeros({p.numel()}, at::kFloat));
    for (int m = 0; m < micro; ++m) {
      Loss(model, params, Input(model, r, m), kBatch * micro).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        acc[i].add_(params[i].grad().to(at::kFloat).flatten());
        params[i].mutable_grad() = at::Tensor();
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor x = world > 1 ? acc[i].mul(1.0 / world) : acc[i];
      if (r == 0) {
        ref.mean.push_back(x.clone());
        ref.abs_sum.push_back(x.abs());
      } else {
        ref.mean[i].add_(x);
        ref.abs_sum[i].add_(x.abs());
      }
    }
  }
  return ref;
}

layout::FullParamLayout Plan(const Model& model, int world) {
  layout::LayoutOptions options;
  options.dp = world;
  options.bucket_size = 256;
  auto plan = layout::ComputeFullParamLayout(model.specs, options);
  if (!plan.ok()) {
    std::fprintf(stderr, "layout: %s\n", plan.status().ToString().c_str());
    std::exit(1);
  }
  return *plan;
}

struct Run {
  std::vector<at::Tensor> params;
  std::vector<SyncEvent> events;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::optional<LayerHooks> hooks;  // the forward calls them when set
};

absl::StatusOr<std::unique_ptr<Run>> MakeRun(const Model& model, int world, DdpConfig config,
                                             Communicator* comm, Communicator* expert_comm) {
  auto run = std::make_unique<Run>();
  run->params = MakeParams(model);
  Run* raw = run.get();
  config.on_event = [raw](const SyncEvent& e) { raw->events.push_back(e); };
  ASSIGN_OR_RETURN(run->ddp, DistributedDataParallel::Create(Plan(model, world), run->params, comm,
                                                             expert_comm, config));
  return run;
}

int Count(const std::vector<SyncEvent>& events, SyncEvent::Kind kind) {
  return static_cast<int>(std::count_if(events.begin(), events.end(),
                                        [kind](const SyncEvent& e) { return e.kind == kind; }));
}

// One step: `micro` micro-batches of this rank, then FinishGradSync. Checks that nothing was
// communicated before the last micro-batch.
absl::Status Step(const Model& model, Run& run, int rank, int micro) {
  run.ddp->ZeroGradBuffers();
  run.events.clear();
  for (int m = 0; m < micro; ++m) {
    run.ddp->set_is_last_microbatch(m == micro - 1);
    Loss(model, run.params, Input(model, rank, m), kBatch * micro,
         run.hooks ? &*run.hooks : nullptr)
        .backward();
    // Sharded residency gathers and releases params in every micro-batch; nothing else may happen.
    const bool communicated =
        std::any_of(run.events.begin(), run.events.end(), [](const SyncEvent& e) {
          return e.kind != SyncEvent::Kind::kParamGatherLaunched &&
                 e.kind != SyncEvent::Kind::kParamGatherWaited &&
                 e.kind != SyncEvent::Kind::kParamsReleased;
        });
    if (m < micro - 1 && communicated) {
      return absl::InternalError(absl::StrCat("micro-batch ", m, " of ", micro, " caused ",
                                              run.events.size(), " sync events, expected none"));
    }
  }
  return run.ddp->FinishGradSync();
}

// Every shard of this rank equals the reference mean gradient (zero on padding). Each addend x_r
// is bitwise the same here and on rank r (same ops, shapes and machine); only Gloo's order of the
// cross-rank sum may differ. A sum of two addends has one rounding whatever the order, so at
// world <= 2 the shards must be bitwise equal. Any order or tree of world - 1 fp32 additions is
// within gamma(world - 1) sum_r |x_r| of the exact sum (Higham, "Accuracy and Stability of
// Numerical Algorithms", 4.2; gamma(k) = k u / (1 - k u), u = 2^-24), so at world >= 3 two orders
// differ by at most 2 gamma(world - 1) sum_r |x_r| per element. A dropped micro-batch, a missing
// rank or a wrong scale is off by a whole addend.
absl::Status CheckGradShard(const DistributedDataParallel& ddp, const ReferenceGrads& ref,
                            int rank, int world);

// With the reduce-scatter grad sync each rank checks its own shards; with the all-reduce one, every
// shard of every bucket on every rank.
absl::Status CheckGradShards(const DistributedDataParallel& ddp, const ReferenceGrads& ref,
                             int rank, int world, bool whole = false) {
  for (int r = whole ? 0 : rank; r < (whole ? world : rank + 1); ++r) {
    RETURN_IF_ERROR(CheckGradShard(ddp, ref, r, world));
  }
  return absl::OkStatus();
}

absl::Status CheckGradShard(const DistributedDataParallel& ddp, const ReferenceGrads& ref,
                            int rank, int world) {
  const double u = std::ldexp(1.0, -24);
  const double bound_factor = world <= 2 ? 0.0 : 2.0 * (world - 1) * u / (1.0 - (world - 1) * u);
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    const buffers::ParamAndGradBuffer& buf = ddp.buffer(b);
    const layout::PerBufferParamLayout& lay = buf.layout();
    for (int k = 0; k < buf.num_buckets(); ++k) {
      const auto [s, e] = lay.ShardRange(k, rank);
      if (e == s) continue;
      at::Tensor expected = at::zeros({e - s}, at::kFloat);
      at::Tensor bound = at::zeros({e - s}, at::kFloat);
      for (const layout::ParamPlacement& p : lay.params) {
        const int64_t lo = std::max(s, p.start), hi = std::min(e, p.end);
        if (lo >= hi) continue;
        expected.narrow(0, lo - s, hi - lo)
            .copy_(ref.mean[p.param_index].narrow(0, lo - p.start, hi - lo));
        bound.narrow(0, lo - s, hi - lo)
            .copy_(ref.abs_sum[p.param_index].narrow(0, lo - p.start, hi - lo));
      }
      const at::Tensor actual = buf.GradShard(k, rank).to(at::kFloat);
      const at::Tensor diff = actual.sub(expected).abs();
      const bool ok = world <= 2 ? at::equal(actual, expected)
                                 : diff.le(bound.mul(bound_factor)).all().item<bool>();
      if (!ok) {
        return absl::InternalError(absl::StrCat(
            "buffer ", lay.key.ToString(), " bucket ", k, " shard ", rank, ": max |diff| ",
            diff.max().item<double>(), " from the reference mean gradient, ",
            world <= 2 ? "expected bitwise equality"
                       : absl::StrCat("over 2 gamma(", world - 1, ") sum_r |x_r| (up to ",
                                      bound.max().item<double>() * bound_factor, ")")));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShardsBitwise(const DistributedDataParallel& a, const DistributedDataParallel& b,
                                int rank) {
  for (int i = 0; i < a.num_buffers(); ++i) {
    for (int k = 0; k < a.buffer(i).num_buckets(); ++k) {
      if (!a.buffer(i).GradShard(k, rank).equal(b.buffer(i).GradShard(k, rank))) {
        return absl::InternalError(absl::StrCat("buffer ", i, " bucket ", k, " shard ", rank,
                                                ": overlap on and off differ"));
      }
    }
  }
  return absl::OkStatus();
}

// Overlap on: every reduce-scatter was launched before backward ended, in GradReduceOrder per
// communicator. Overlap off: none before.
absl::Status CheckGradEvents(const Run& run, bool overlap) {
  const auto orders = run.ddp->GradReduceOrder();
  size_t total = 0;
  for (const auto& order : orders) total += order.size();
  int launched_before_end = 0;
  bool ended = false;
  std::vector<std::pair<int, int>> launches;
  for (const SyncEvent& e : run.events) {
    if (e.kind == SyncEvent::Kind::kBackwardEnded) ended = true;
    if (e.kind == SyncEvent::Kind::kGradReduceLaunched) {
      launches.push_back({e.buffer, e.group});
      if (!ended) ++launched_before_end;
    }
  }
  if (!ended) return absl::InternalError("no backward_ended event");
  if (launches.size() != total) {
    return absl::InternalError(absl::StrCat(launches.size(), " launches, expected ", total));
  }
  const int expected_before = overlap ? static_cast<int>(total) : 0;
  if (launched_before_end != expected_before) {
    return absl::InternalError(absl::StrCat(launched_before_end,
                                            " reduce-scatters launched during backward, expected ",
                                            expected_before));
  }
  for (const auto& order : orders) {
    std::vector<std::pair<int, int>> mine;
    for (const auto& l : launches) {
      if (std::find(order.begin(), order.end(), l) != order.end()) mine.push_back(l);
    }
    if (mine != order) return absl::InternalError("reduce-scatters not launched in order");
  }
  return absl::OkStatus();
}

absl::Status GradSyncPhase(const Model& model, int world, int rank, Communicator* comm,
                           Communicator* expert_comm) {
  const ReferenceGrads ref = ReferenceMeanGrads(model, world, 1);
  // Overlap off, on, and on with two buckets per group.
  std::unique_ptr<Run> runs[3];
  for (int i = 0; i < 3; ++i) {
    DdpConfig config;
    config.overlap_grad_reduce = i > 0;
    config.buckets_per_group = i == 2 ? 2 : 1;
    ASSIGN_OR_RETURN(runs[i], MakeRun(model, world, config, comm, expert_comm));
    for (int step = 0; step < 2; ++step) {  // the second step proves the reset between steps
      RETURN_IF_ERROR(Step(model, *runs[i], rank, 1));
      RETURN_IF_ERROR(CheckGradEvents(*runs[i], i > 0));
      RETURN_IF_ERROR(CheckGradShards(*runs[i]->ddp, ref, rank, world));
    }
  }
  RETURN_IF_ERROR(CheckShardsBitwise(*runs[0]->ddp, *runs[1]->ddp, rank));
  return CheckShardsBitwise(*runs[0]->ddp, *runs[2]->ddp, rank);
}

// The all-reduce grad sync (replicated optimizers): every rank ends with the whole mean in every
// bucket, and there is no param sync (StartParamSync launches nothing, params stay as they are).
absl::Status AllReduceGradSyncPhase(const Model& model, int world, int rank, Communicator* comm,
                                    Communicator* expert_comm) {
  const ReferenceGrads ref = ReferenceMeanGrads(model, world, 1);
  for (bool overlap : {false, true}) {
    DdpConfig config;
    config.overlap_grad_reduce = overlap;
    config.grad_sync = buffers::GradSync::kAllReduce;
    ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(model, world, config, comm, expert_comm));
    RETURN_IF_ERROR(Step(model, *run, rank, 1));
    RETURN_IF_ERROR(CheckGradEvents(*run, overlap));
    RETURN_IF_ERROR(CheckGradShards(*run->ddp, ref, rank, world, /*whole=*/true));
    std::vector<at::Tensor> before;
    for (int b = 0; b < run->ddp->num_buffers(); ++b) {
      before.push_back(run->ddp->buffer(b).param_data().clone());
    }
    run->events.clear();
    RETURN_IF_ERROR(run->ddp->bucket_groups().StartParamSync());
    RETURN_IF_ERROR(run->ddp->FinishParamSync());
    if (Count(run->events, SyncEvent::Kind::kParamGatherLaunched) != 0) {
      return absl::InternalError("all-reduce grad sync: a param gather was launched");
    }
    for (int b = 0; b < run->ddp->num_buffers(); ++b) {
      if (!at::equal(before[b], run->ddp->buffer(b).param_data())) {
        return absl::InternalError("all-reduce grad sync: the param sync changed params");
      }
    }
  }
  return absl::OkStatus();
}

// Three micro-batches accumulated in the grad buffer (fp32 grads for the bf16 params too), against
// the reference accumulating them the same way.
absl::Status AccumulationPhase(const Model& model, int world, int rank, Communicator* comm,
                               Communicator* expert_comm) {
  constexpr int kMicro = 3;
  const ReferenceGrads ref = ReferenceMeanGrads(model, world, kMicro);
  DdpConfig config;
  config.overlap_grad_reduce = true;
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(model, world, config, comm, expert_comm));
  RETURN_IF_ERROR(Step(model, *run, rank, kMicro));
  return CheckGradShards(*run->ddp, ref, rank, world);
}

at::Tensor ExpectedParams(const buffers::ParamAndGradBuffer& buf, int b) {
  return Pattern(buf.param_data().numel(), 0.3 * b + 2, 0.011).to(buf.param_data().scalar_type());
}

// The stage ParamSyncStage should give params[i]: its group's forward position in the gather order
// of its communicator, after the stages of the communicators before it.
absl::StatusOr<int> ExpectedStage(const DistributedDataParallel& ddp, const Model& model, int i,
                                  int buckets_per_group) {
  const auto orders = ddp.GradReduceOrder();
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    const layout::ParamPlacement* p = ddp.buffer(b).layout().Find(model.specs[i].name);
    if (p == nullptr) continue;
    const std::pair<int, int> group{b, p->bucket / buckets_per_group};
    int before = 0;
    for (const auto& order : orders) {
      const auto it = std::find(order.begin(), order.end(), group);
      if (it != order.end()) {
        return before + static_cast<int>(order.end() - it) - 1;  // forward position
      }
      before += static_cast<int>(order.size());
    }
  }
  return absl::InternalError(absl::StrCat("param '", model.specs[i].name, "' is in no group"));
}

// The param sync stage of the param named `name` (BucketGroupSync::ParamSyncStage of its bucket).
int StageOf(DistributedDataParallel& ddp, const std::string& name) {
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    const layout::ParamPlacement* p = ddp.buffer(b).layout().Find(name);
    if (p != nullptr) return ddp.bucket_groups().ParamSyncStage(b, p->bucket);
  }
  return -1;
}

// The stages of a staged step, as the optimizer reports them: checks each param's stage, the
// errors before BeginParamSync and out of range, and that each of the first half of the stages
// launches exactly its group's gather at once. Returns the stages reported. Without overlap there
// are no stages.
absl::StatusOr<int> ReportStages(const Model& model, Run& run, bool overlap,
                                 int buckets_per_group) {
  DistributedDataParallel& ddp = *run.ddp;
  const auto orders = ddp.GradReduceOrder();
  if (!overlap) {
    // Without overlap_param_gather the param sync is one launch-and-wait after the step: no stages.
    if (ddp.bucket_groups().num_param_sync_stages() != 0) {
      return absl::InternalError("param sync stages without overlap_param_gather");
    }
    return 0;
  }
  const int n = ddp.bucket_groups().num_param_sync_stages();
  int groups = 0;
  for (const auto& order : orders) groups += static_cast<int>(order.size());
  if (n != groups) {
    return absl::InternalError(absl::StrCat(n, " param sync stages, expected one per group (",
                                            groups, ")"));
  }
  for (size_t i = 0; i < model.specs.size(); ++i) {
    ASSIGN_OR_RETURN(const int want, ExpectedStage(ddp, model, static_cast<int>(i),
                                                   buckets_per_group));
    const int got = StageOf(ddp, model.specs[i].name);
    if (got != want) {
      return absl::InternalError(absl::StrCat("param '", model.specs[i].name, "': stage ", got,
                                              ", expected ", want));
    }
  }
  if (ddp.bucket_groups().ParamSyncStageDone(0).code() != absl::StatusCode::kInvalidArgument) {
    return absl::InternalError("a stage done before BeginParamSync was accepted");
  }
  RETURN_IF_ERROR(ddp.bucket_groups().BeginParamSync());
  if (ddp.bucket_groups().ParamSyncStageDone(n).code() != absl::StatusCode::kInvalidArgument) {
    return absl::InternalError("a stage out of range was accepted");
  }
  const int staged_launches = (n + 1) / 2;
  for (int stage = 0; stage < staged_launches; ++stage) {
    RETURN_IF_ERROR(ddp.bucket_groups().ParamSyncStageDone(stage));
    // Each stage launches exactly its own group's gather, at once.
    const int launched = Count(run.events, SyncEvent::Kind::kParamGatherLaunched);
    if (launched != stage + 1 ||
        run.events.back().kind != SyncEvent::Kind::kParamGatherLaunched) {
      return absl::InternalError(absl::StrCat("after stage ", stage, ": ", launched,
                                              " gathers launched, expected ", stage + 1));
    }
  }
  return staged_launches;
}

// After the step's StartParamSync: with overlap, one gather per communicator not yet started by a
// stage was added and none waited on.
absl::Status CheckStartLaunches(const Run& run, bool overlap, bool staged, int staged_launches) {
  const auto orders = run.ddp->GradReduceOrder();
  if (overlap && staged) {
    // StartParamSync adds the first gather of a communicator no stage reached.
    int want = staged_launches;
    for (size_t q = 0, before = 0; q < orders.size(); before += orders[q].size(), ++q) {
      if (static_cast<int>(before) >= staged_launches) ++want;
    }
    const int launched = Count(run.events, SyncEvent::Kind::kParamGatherLaunched);
    if (launched != want || Count(run.events, SyncEvent::Kind::kParamGatherWaited) != 0) {
      return absl::InternalError(absl::StrCat("after a staged StartParamSync: ", launched,
                                              " gathers launched, expected ", want,
                                              " and none waited"));
    }
  } else if (overlap) {
    const int launched = Count(run.events, SyncEvent::Kind::kParamGatherLaunched);
    if (launched != static_cast<int>(orders.size()) ||
        Count(run.events, SyncEvent::Kind::kParamGatherWaited) != 0) {
      return absl::InternalError(absl::StrCat("after StartParamSync: ", launched,
                                              " gathers launched, expected one per communicator (",
                                              orders.size(), ") and none waited"));
    }
  }
  return absl::OkStatus();
}

// Each rank writes the expected values only into its own shards (garbage elsewhere); param sync
// must make all of param_data the expected values. With overlap_param_gather, checks per layer
// that the hook waited on every group of that layer, kept at most one gather in flight beyond
// those waited on (unstaged), and launched in forward order. `staged`: the step's stages are
// reported first (the bucket groups' BeginParamSync, ParamSyncStageDone for the first half of the
// stages), as a staged optimizer step does; each launches its group's gather at once. Without
// overlap there are no stages.
absl::Status ParamSyncPhase(const Model& model, int world, int rank, Communicator* comm,
                            Communicator* expert_comm, bool overlap, int buckets_per_group = 1,
                            bool staged = false) {
  DdpConfig config;
  config.overlap_param_gather = overlap;
  config.buckets_per_group = buckets_per_group;
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(model, world, config, comm, expert_comm));
  DistributedDataParallel& ddp = *run->ddp;
  ASSIGN_OR_RETURN(std::function<void(int)> hook, ddp.PreForwardHook(model.layers));
  {
    c10::NoGradGuard no_grad;
    for (int b = 0; b < ddp.num_buffers(); ++b) {
      buffers::ParamAndGradBuffer& buf = ddp.buffer(b);
      buf.param_data().fill_(100 + rank);
      at::Tensor expected = ExpectedParams(buf, b);
      for (int k = 0; k < buf.num_buckets(); ++k) {
        const auto [s, e] = buf.layout().ShardRange(k, rank);
        buf.ParamShard(k, rank).copy_(expected.narrow(0, s, e - s));
      }
    }
  }
  run->events.clear();
  const auto orders = ddp.GradReduceOrder();
  int staged_launches = 0;
  if (staged) {
    ASSIGN_OR_RETURN(staged_launches, ReportStages(model, *run, overlap, buckets_per_group));
  }
  RETURN_IF_ERROR(ddp.bucket_groups().StartParamSync());
  auto waited = [&](std::pair<int, int> group) {
    for (const SyncEvent& e : run->events) {
      if (e.kind == SyncEvent::Kind::kParamGatherWaited && e.buffer == group.first &&
          e.group == group.second) {
        return true;
      }
    }
    return false;
  };
  RETURN_IF_ERROR(CheckStartLaunches(*run, overlap, staged, staged_launches));
  const int num_layers = model.layers.back() + 1;
  for (int layer = 0; layer < num_layers; ++layer) {
    hook(layer);
    for (size_t i = 0; i < model.layers.size(); ++i) {
      if (model.layers[i] != layer) continue;
      for (int bi = 0; bi < ddp.num_buffers(); ++bi) {
        const layout::ParamPlacement* p = ddp.buffer(bi).layout().Find(model.specs[i].name);
        if (p == nullptr) continue;
        const int bucket_group = p->bucket / config.buckets_per_group;
        if (overlap && !waited({bi, bucket_group})) {
          return absl::InternalError(absl::StrCat("after the hook of layer ", layer, ": group of '",
                                                  p->name, "' not waited on"));
        }
        at::Tensor expected = ExpectedParams(ddp.buffer(bi), bi).narrow(0, p->start, p->numel());
        if (!run->params[i].flatten().equal(expected)) {
          return absl::InternalError(absl::StrCat("after the hook of layer ", layer, ": param '",
                                                  p->name, "' differs from the gathered values"));
        }
      }
    }
    if (overlap) {
      for (const auto& order : orders) {
        int launched = 0, done = 0;
        for (const SyncEvent& e : run->events) {
          const bool mine = std::find(order.begin(), order.end(),
                                      std::pair<int, int>{e.buffer, e.group}) != order.end();
          if (mine && e.kind == SyncEvent::Kind::kParamGatherLaunched) {
            if (order[order.size() - 1 - launched] != std::pair<int, int>{e.buffer, e.group}) {
              return absl::InternalError("param gathers not launched in forward order");
            }
            ++launched;
          }
          if (mine && e.kind == SyncEvent::Kind::kParamGatherWaited) ++done;
        }
        if (!staged && launched - done > 1) {
          return absl::InternalError(absl::StrCat("after the hook of layer ", layer, ": ",
                                                  launched - done,
                                                  " gathers in flight, expected <= 1"));
        }
      }
    }
  }
  RETURN_IF_ERROR(ddp.FinishParamSync());
  for (int b = 0; b < ddp.num_buffers(); ++b) {
    if (!ddp.buffer(b).param_data().equal(ExpectedParams(ddp.buffer(b), b))) {
      return absl::InternalError(absl::StrCat("buffer ", b, ": param_data differs after sync"));
    }
  }
  return absl::OkStatus();
}

// Sharded residency (ZeRO-3): two steps of `micro` micro-batches through the layer hooks. The
// gradient shards equal the reference mean (the grad_sync bound) and a kFull run's bitwise; between
// steps no full bucket exists: every bucket's param and grad storage and every param's and
// `.grad`'s storage hold 0 bytes, and the persistent bytes are this rank's shards. With
// reshard_after_forward the forward releases groups after their last layer (all but the last
// layer's), and the transient peak stays below the whole buffers.
absl::Status ShardedPhase(const Model& model, int world, int rank, Communicator* comm,
                          Communicator* expert_comm, int micro, bool reshard, bool overlap) {
  const ReferenceGrads ref = ReferenceMeanGrads(model, world, micro);
  DdpConfig full_config;
  full_config.overlap_grad_reduce = overlap;
  ASSIGN_OR_RETURN(std::unique_ptr<Run> full,
                   MakeRun(model, world, full_config, comm, expert_comm));
  DdpConfig config = full_config;
  config.residency = buffers::Residency::kSharded;
  config.reshard_after_forward = reshard;
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(model, world, config, comm, expert_comm));
  ASSIGN_OR_RETURN(run->hooks, run->ddp->MakeLayerHooks(model.layers));
  const std::string what = absl::StrCat("sharded (micro ", micro, ", reshard_after_forward ",
                                        reshard, ", overlap_grad_reduce ", overlap, ")");
  int64_t full_bytes = 0, shard_bytes = 0;
  for (int b = 0; b < run->ddp->num_buffers(); ++b) {
    const buffers::ParamAndGradBuffer& buf = run->ddp->buffer(b);
    int64_t shard_numel = 0;
    for (int k = 0; k < buf.num_buckets(); ++k) shard_numel += buf.layout().buckets[k].shard_size;
    const int64_t bytes_per_element = buf.ParamBucket(0).element_size() + 4;  // fp32 grads
    full_bytes += buf.layout().numel() * bytes_per_element;
    shard_bytes += shard_numel * bytes_per_element;
  }
  auto check_released = [&](const std::string& when) -> absl::Status {
    const DdpMemory memory = run->ddp->memory();
    if (memory.transient_bytes != 0 || memory.param_bytes + memory.grad_bytes != shard_bytes) {
      return absl::InternalError(absl::StrCat(what, " ", when, ": ", memory.transient_bytes,
                                              " transient bytes, ",
                                              memory.param_bytes + memory.grad_bytes,
                                              " persistent (expected 0 and ", shard_bytes, ")"));
    }
    for (int b = 0; b < run->ddp->num_buffers(); ++b) {
      const buffers::ParamAndGradBuffer& buf = run->ddp->buffer(b);
      for (int k = 0; k < buf.num_buckets(); ++k) {
        if (buf.params_materialized(k) || buf.grads_materialized(k) ||
            buf.ParamBucket(k).storage().nbytes() != 0 ||
            buf.GradBucket(k).storage().nbytes() != 0) {
          return absl::InternalError(absl::StrCat(what, " ", when, ": buffer ", b, " bucket ", k,
                                                  " still holds full-size storage"));
        }
      }
    }
    for (size_t i = 0; i < run->params.size(); ++i) {
      if (run->params[i].storage().nbytes() != 0 || run->params[i].grad().storage().nbytes() != 0) {
        return absl::InternalError(absl::StrCat(what, " ", when, ": param ", model.specs[i].name,
                                                " or its grad still has storage"));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check_released("after Create"));
  for (int step = 0; step < 2; ++step) {
    RETURN_IF_ERROR(Step(model, *run, rank, micro));
    RETURN_IF_ERROR(Step(model, *full, rank, micro));
    RETURN_IF_ERROR(CheckGradShards(*run->ddp, ref, rank, world));
    RETURN_IF_ERROR(CheckShardsBitwise(*run->ddp, *full->ddp, rank));
    int released_in_forward = 0;
    for (const SyncEvent& e : run->events) {
      released_in_forward += e.kind == SyncEvent::Kind::kParamsReleased && e.layer >= 0;
    }
    const int layers = model.layers.back() + 1;
    if (reshard && layers > 1 && released_in_forward == 0) {
      return absl::InternalError(what + ": no group released after its forward");
    }
    if (!reshard && released_in_forward != 0) {
      return absl::InternalError(what + ": groups released during forward");
    }
    RETURN_IF_ERROR(run->ddp->bucket_groups().StartParamSync());
    RETURN_IF_ERROR(check_released(absl::StrCat("after step ", step)));
  }
  const DdpMemory memory = run->ddp->memory();
  std::printf("ddp %s on rank %d: persistent %lld bytes, transient peak %lld, whole buffers %lld\n",
              what.c_str(), rank, static_cast<long long>(memory.param_bytes + memory.grad_bytes),
              static_cast<long long>(memory.peak_transient_bytes),
              static_cast<long long>(full_bytes));
  if (memory.peak_transient_bytes <= 0 || memory.peak_transient_bytes > full_bytes) {
    return absl::InternalError(absl::StrCat(what, ": transient peak ", memory.peak_transient_bytes,
                                            " bytes, expected in (0, ", full_bytes, "]"));
  }
  // Sharded ranks cannot step replicated optimizers: the all-reduce grad sync is refused.
  config.grad_sync = buffers::GradSync::kAllReduce;
  std::vector<at::Tensor> params = MakeParams(model);
  auto refused =
      DistributedDataParallel::Create(Plan(model, world), params, comm, expert_comm, config);
  if (refused.ok() || !absl::StrContains(refused.status().message(), "reduce-scatter grad sync")) {
    return absl::InternalError("sharded residency with the all-reduce grad sync was not refused");
  }
  return absl::OkStatus();
}

// Validation errors at Create and PreForwardHook.
absl::Status ErrorsPhase(int world, Communicator* comm) {
  const Model model = TinyModel();
  std::vector<at::Tensor> params = MakeParams(model);
  auto wrong_dp =
      DistributedDataParallel::Create(Plan(model, world + 1), params, comm, nullptr, {});
  if (wrong_dp.ok() || wrong_dp.status().code() != absl::StatusCode::kInvalidArgument ||
      !absl::StrContains(wrong_dp.status().message(),
                         absl::StrCat("is planned for dp ", world + 1,
                                      " but its dense communicator has ", world, " ranks"))) {
    return absl::InternalError(absl::StrCat("wrong dp gave ", wrong_dp.status().ToString()));
  }
  params[1] = params[1].detach();
  auto no_grad = DistributedDataParallel::Create(Plan(model, world), params, comm, nullptr, {});
  if (no_grad.ok() ||
      !absl::StrContains(no_grad.status().message(), "'t.b' must be a defined leaf")) {
    return absl::InternalError(
        absl::StrCat("param without grad gave ", no_grad.status().ToString()));
  }
  params = MakeParams(model);
  ASSIGN_OR_RETURN(auto ddp,
                   DistributedDataParallel::Create(Plan(model, world), params, comm, nullptr, {}));
  auto hook = ddp->PreForwardHook({1, 0});
  if (hook.ok() || !absl::StrContains(hook.status().message(), "param #1 has layer 0")) {
    return absl::InternalError(absl::StrCat("decreasing layers gave ", hook.status().ToString()));
  }
  return absl::OkStatus();
}

// The last rank never joins the reduce-scatter: the others' FinishGradSync must time out naming
// the buffer, the bucket group and the collective.
absl::Status TimeoutPhase(int world, int rank, Communicator* comm) {
  const Model model = TinyModel();
  if (rank == world - 1) {
    sleep(12);
    return absl::OkStatus();
  }
  DdpConfig config;
  config.timeout = absl::Seconds(2);
  ASSIGN_OR_RETURN(std::unique_ptr<Run> run, MakeRun(model, world, config, comm, nullptr));
  const absl::Status status = Step(model, *run, rank, 1);
  if (status.code() != absl::StatusCode::kDeadlineExceeded ||
      !absl::StrContains(status.message(), "ddp: grad reduce-scatter of buffer ") ||
      !absl::StrContains(status.message(), "bucket group 0 (buckets 0) failed")) {
    return absl::InternalError(absl::StrCat("timeout gave ", status.ToString()));
  }
  return absl::OkStatus();
}

// The expert group: the same ranks over the launcher's store under another prefix.
absl::StatusOr<std::unique_ptr<Communicator>> JoinExpertGroup() {
  using namespace collectives;
  ASSIGN_OR_RETURN(RendezvousInfo info, ParseRendezvous(ProcessEnvironment()));
  GlooOptions options = GlooOptionsFromRendezvous(info);
  options.timeout = absl::Seconds(60);
  options.rendezvous_timeout = absl::Seconds(60);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(info.master_port);
    store_options.isServer = info.HostsStore();
    store_options.waitWorkers = false;
    store_options.timeout = std::chrono::seconds(60);
    auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, store_options);
    return CreateGlooCommunicator(
        c10::make_intrusive<c10d::PrefixStore>("expert", std::move(store)), options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("expert store: ", e.what()));
  }
}

class DdpMultiRankTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpMultiRankTest, AllPhasesPassOnEveryRank) {
  collectives::testing::RunOnRanks(GetParam(), [](Communicator& comm) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> expert_comm, JoinExpertGroup());
    const int world = comm.size(), rank = comm.rank();
    Communicator* dense = &comm;
    Communicator* expert = expert_comm.get();
    const Model main_model = MainModel(), tiny = TinyModel();
    const std::vector<std::pair<std::string, std::function<absl::Status()>>> phases = {
        {"errors", [&] { return ErrorsPhase(world, dense); }},
        {"grad_sync", [&] { return GradSyncPhase(main_model, world, rank, dense, expert); }},
        {"all_reduce_grad_sync",
         [&] { return AllReduceGradSyncPhase(main_model, world, rank, dense, expert); }},
        {"accumulation", [&] { return AccumulationPhase(main_model, world, rank, dense, expert); }},
        {"param_sync",
         [&] { return ParamSyncPhase(main_model, world, rank, dense, expert, false); }},
        {"param_sync_overlap",
         [&] { return ParamSyncPhase(main_model, world, rank, dense, expert, true); }},
        {"param_sync_overlap_grouped",
         [&] { return ParamSyncPhase(main_model, world, rank, dense, expert, true, 2); }},
        {"param_sync_staged",
         [&] { return ParamSyncPhase(main_model, world, rank, dense, expert, true, 1, true); }},
        {"param_sync_staged_no_overlap",
         [&] { return ParamSyncPhase(main_model, world, rank, dense, expert, false, 1, true); }},
        {"tiny_grad_sync", [&] { return GradSyncPhase(tiny, world, rank, dense, nullptr); }},
        {"sharded",
         [&] { return ShardedPhase(main_model, world, rank, dense, expert, 1, true, true); }},
        {"sharded_micro3",
         [&] { return ShardedPhase(main_model, world, rank, dense, expert, 3, true, true); }},
        {"sharded_keep_after_forward_no_overlap",
         [&] { return ShardedPhase(main_model, world, rank, dense, expert, 2, false, false); }},
        {"tiny_sharded",
         [&] { return ShardedPhase(tiny, world, rank, dense, nullptr, 1, true, true); }},
        {"tiny_param_sync_overlap",
         [&] { return ParamSyncPhase(tiny, world, rank, dense, nullptr, true); }},
        // Last: it leaves a collective unfinished (the harness ends the rank without teardown).
        {"timeout",
         [&] { return world > 1 ? TimeoutPhase(world, rank, dense) : absl::OkStatus(); }},
    };
    for (const auto& [name, phase] : phases) {
      const absl::Status status = phase();
      ASSERT_TRUE(status.ok()) << "ddp phase " << name << ": " << status;
      std::printf("ddp phase %s passed on rank %d\n", name.c_str(), rank);
    }
    expert_comm.release();  // may be inside the timed-out collective's peer state too
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpMultiRankTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::ddp
