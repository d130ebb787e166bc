// The bucket groups (BucketGroupSync, ParamAndGradBucketGroup) with real Gloo ranks (the
// multi-rank harness) at 1, 2 and 3 processes, in phases run in order on every rank: the grad sync
// (gradients registered in forward order start nothing until the chain's head is complete, then
// start in chain order; each group's state; the summed shards), the param sync of a staged step
// (stages start their group and every earlier one, in forward order; the pre-forward wait starts
// the next group; each group's state; the gathered params), the sharded residency's
// gather / release cycle, Create's errors, and a timeout naming the group and the collective.
#include "buffers/bucket_group.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/testing/multi_rank.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "layout/layout.h"

namespace orthoshard::buffers {
namespace {

using collectives::Communicator;
using Group = ParamAndGradBucketGroup;

layout::ParamSpec Spec(std::string name, std::vector<int64_t> shape, layout::ParamRole role) {
  layout::ParamSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.dtype = DType::kFloat32;
  spec.role = role;
  return spec;
}

// Two buffers (Muon matrices and Adam vectors) of several buckets each, on one communicator, so
// that the chain merges them; or (tiny) one param in one bucket.
struct Model {
  std::vector<at::Tensor> params;
  std::vector<std::unique_ptr<ParamAndGradBuffer>> buffers;
  std::vector<BucketGroupEvent> events;
  std::unique_ptr<BucketGroupSync> sync;
};

absl::StatusOr<std::unique_ptr<Model>> MakeModel(Communicator& comm, BucketGroupOptions options,
                                                 Residency residency = Residency::kFull,
                                                 bool tiny = false) {
  using layout::ParamRole;
  std::vector<layout::ParamSpec> specs = {Spec("w0", {8, 4}, ParamRole::kMuon)};
  if (!tiny) {
    specs.push_back(Spec("b0", {8}, ParamRole::kAdam));
    specs.push_back(Spec("w1", {8, 8}, ParamRole::kMuon));
    specs.push_back(Spec("b1", {8}, ParamRole::kAdam));
    specs.push_back(Spec("w2", {4, 8}, ParamRole::kMuon));
    specs.push_back(Spec("b2", {4}, ParamRole::kAdam));
  }
  layout::LayoutOptions lo;
  lo.dp = comm.size();
  lo.bucket_size = 32;
  ASSIGN_OR_RETURN(const layout::FullParamLayout plan, layout::ComputeFullParamLayout(specs, lo));
  auto model = std::make_unique<Model>();
  for (const layout::ParamSpec& spec : specs) {
    model->params.push_back(at::arange(spec.numel(), at::kFloat).reshape(spec.shape).clone());
    model->params.back().set_requires_grad(true);
  }
  BufferOptions bo;
  bo.residency = residency;
  bo.rank = comm.rank();
  std::vector<ParamAndGradBuffer*> raw;
  for (const layout::PerBufferParamLayout& buf : plan.buffers) {
    ASSIGN_OR_RETURN(std::unique_ptr<ParamAndGradBuffer> buffer,
                     ParamAndGradBuffer::Create(buf, model->params, bo));
    raw.push_back(buffer.get());
    model->buffers.push_back(std::move(buffer));
  }
  Model* m = model.get();
  options.on_event = [m](const BucketGroupEvent& e) { m->events.push_back(e); };
  ASSIGN_OR_RETURN(model->sync, BucketGroupSync::Create(
                                    raw, std::vector<Communicator*>(raw.size(), &comm), options));
  return model;
}

// Values every rank can compute: buffer b, element i, as rank r writes it.
at::Tensor Values(const ParamAndGradBuffer& buffer, int b, int r) {
  return at::arange(buffer.layout().numel(), at::kFloat).add(100 * b).mul(r + 1);
}

std::vector<std::pair<int, int>> Launched(const Model& m, BucketGroupEvent::Kind kind) {
  std::vector<std::pair<int, int>> out;
  for (const BucketGroupEvent& e : m.events) {
    if (e.kind == kind) out.push_back({e.buffer, e.group});
  }
  return out;
}

// Gradients registered param by param in forward order: the chain's head (the group of the
// latest params) completes last, so nothing starts before it, then every group in chain order.
// Summed shards (average_gradients off, so integer sums are exact).
absl::Status GradSyncPhase(Communicator& comm) {
  BucketGroupOptions options;
  options.average_gradients = false;
  options.overlap_grad_reduce = true;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> m, MakeModel(comm, options));
  BucketGroupSync& sync = *m->sync;
  const auto orders = sync.GradSyncOrder();
  if (orders.size() != 1 || orders[0].size() < 3) {
    return absl::InternalError(absl::StrCat("expected one chain of >= 3 groups, got ",
                                            orders.size(), " chains"));
  }
  const std::vector<std::pair<int, int>>& order = orders[0];
  for (int step = 0; step < 2; ++step) {  // the second proves the reset
    m->events.clear();
    for (int b = 0; b < sync.num_buffers(); ++b) {
      m->buffers[b]->grad_data().copy_(Values(*m->buffers[b], b, comm.rank()));
    }
    // Forward order of params: param_index ascending over every buffer.
    std::vector<std::tuple<int, int, int>> params;  // (param index, buffer, bucket)
    for (int b = 0; b < sync.num_buffers(); ++b) {
      for (const layout::ParamPlacement& p : m->buffers[b]->layout().params) {
        params.push_back({p.param_index, b, p.bucket});
      }
    }
    std::sort(params.begin(), params.end());
    for (size_t k = 0; k < params.size(); ++k) {
      const auto [index, b, bucket] = params[k];
      RETURN_IF_ERROR(sync.RegisterGradReady(b, sync.GroupOfBucket(b, bucket)));
      const bool last = k + 1 == params.size();
      const size_t launched = Launched(*m, BucketGroupEvent::Kind::kGradSyncLaunched).size();
      if (!last && launched != 0) {
        return absl::InternalError(absl::StrCat("a grad sync started after ", k + 1, " of ",
                                                params.size(), " params: not in chain order"));
      }
    }
    if (Launched(*m, BucketGroupEvent::Kind::kGradSyncLaunched) != order) {
      return absl::InternalError("grad syncs not started in chain order");
    }
    for (const auto& [b, g] : order) {
      if (sync.group(b, g).grad_state() != Group::GradState::kInFlight ||
          !sync.group(b, g).grads_ready()) {
        return absl::InternalError(absl::StrCat(sync.group(b, g).Name(), ": not in flight"));
      }
    }
    RETURN_IF_ERROR(sync.FinishGradSync());
    if (Launched(*m, BucketGroupEvent::Kind::kGradSyncWaited) != order) {
      return absl::InternalError("grad syncs not waited on in chain order");
    }
    const int world = comm.size();
    for (int b = 0; b < sync.num_buffers(); ++b) {
      const ParamAndGradBuffer& buf = *m->buffers[b];
      const at::Tensor sum = Values(buf, b, 0).mul(world * (world + 1) / 2);
      for (int k = 0; k < buf.num_buckets(); ++k) {
        const auto [s, e] = buf.layout().ShardRange(k, comm.rank());
        if (!at::equal(buf.GradShard(k, comm.rank()), sum.narrow(0, s, e - s))) {
          return absl::InternalError(absl::StrCat("buffer ", b, " bucket ", k, ": wrong sum"));
        }
      }
      for (int g = 0; g < sync.num_groups(b); ++g) {
        if (sync.group(b, g).grad_state() != Group::GradState::kNotStarted) {
          return absl::InternalError("grad state not reset by FinishGradSync");
        }
      }
    }
  }
  return absl::OkStatus();
}

// A staged step's param sync with overlap_param_gather: each rank writes the expected values into
// its own shards only; stages start groups in forward order (a stage starts the earlier ones too),
// StartParamSync adds nothing when a stage started the chain's first group, the pre-forward wait
// of a group waits on every earlier one and starts the next; afterwards every rank holds it all.
absl::Status ParamSyncPhase(Communicator& comm) {
  BucketGroupOptions options;
  options.overlap_param_gather = true;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> m, MakeModel(comm, options));
  BucketGroupSync& sync = *m->sync;
  std::vector<std::pair<int, int>> forward = sync.GradSyncOrder()[0];
  std::reverse(forward.begin(), forward.end());
  const int n = static_cast<int>(forward.size());
  if (sync.num_param_sync_stages() != n) {
    return absl::InternalError(absl::StrCat(sync.num_param_sync_stages(), " stages, expected ", n));
  }
  for (int f = 0; f < n; ++f) {
    const auto [b, g] = forward[f];
    const int bucket = m->buffers[b]->bucket_groups()[g].buckets[0];
    if (sync.ParamSyncStage(b, bucket) != f) {
      return absl::InternalError(absl::StrCat(sync.group(b, g).Name(), ": stage ",
                                              sync.ParamSyncStage(b, bucket), ", expected ", f));
    }
  }
  const absl::Status early = sync.ParamSyncStageDone(0);
  if (early.code() != absl::StatusCode::kInvalidArgument ||
      !absl::StrContains(early.message(), "before BeginParamSync")) {
    return absl::InternalError(absl::StrCat("stage before begin gave ", early.ToString()));
  }
  RETURN_IF_ERROR(sync.BeginParamSync());
  if (!sync.param_sync_in_flight() || !m->events.empty()) {
    return absl::InternalError("BeginParamSync launched something or marked nothing stale");
  }
  {
    c10::NoGradGuard no_grad;
    for (int b = 0; b < sync.num_buffers(); ++b) {
      ParamAndGradBuffer& buf = *m->buffers[b];
      buf.param_data().fill_(-1);
      const at::Tensor expected = Values(buf, b, 0);
      for (int k = 0; k < buf.num_buckets(); ++k) {
        const auto [s, e] = buf.layout().ShardRange(k, comm.rank());
        buf.ParamShard(k, comm.rank()).copy_(expected.narrow(0, s, e - s));
      }
    }
  }
  RETURN_IF_ERROR(sync.ParamSyncStageDone(1));  // starts stages 0 and 1, in forward order
  const std::vector<std::pair<int, int>> first_two(forward.begin(), forward.begin() + 2);
  if (Launched(*m, BucketGroupEvent::Kind::kParamSyncLaunched) != first_two) {
    return absl::InternalError("stage 1 did not start groups 0 and 1 in forward order");
  }
  if (sync.group(forward[1].first, forward[1].second).param_state() !=
          Group::ParamState::kInFlight ||
      sync.group(forward[2].first, forward[2].second).param_state() != Group::ParamState::kStale) {
    return absl::InternalError("wrong param states after stage 1");
  }
  if (sync.ParamSyncStageDone(n).code() != absl::StatusCode::kInvalidArgument) {
    return absl::InternalError("a stage out of range was accepted");
  }
  RETURN_IF_ERROR(sync.StartParamSync());
  if (Launched(*m, BucketGroupEvent::Kind::kParamSyncLaunched).size() != 2) {
    return absl::InternalError("StartParamSync started more after the stages");
  }
  // The forward reaches group 2: groups 0..2 waited on, group 3 (if any) started.
  RETURN_IF_ERROR(sync.FinishParamSyncFor(forward[2].first, forward[2].second));
  const std::vector<std::pair<int, int>> waited(forward.begin(), forward.begin() + 3);
  if (Launched(*m, BucketGroupEvent::Kind::kParamSyncWaited) != waited) {
    return absl::InternalError("the pre-forward wait did not wait on groups 0..2 in order");
  }
  const size_t want = std::min(n, 4);
  if (Launched(*m, BucketGroupEvent::Kind::kParamSyncLaunched).size() != want) {
    return absl::InternalError("the pre-forward wait did not start the next group");
  }
  RETURN_IF_ERROR(sync.FinishParamSync());
  for (int b = 0; b < sync.num_buffers(); ++b) {
    if (!at::equal(m->buffers[b]->param_data(), Values(*m->buffers[b], b, 0))) {
      return absl::InternalError(absl::StrCat("buffer ", b, ": params differ after the sync"));
    }
    for (int g = 0; g < sync.num_groups(b); ++g) {
      if (sync.group(b, g).param_state() != Group::ParamState::kSynced) {
        return absl::InternalError(absl::StrCat(sync.group(b, g).Name(), ": not synced"));
      }
    }
  }
  if (sync.param_sync_in_flight()) return absl::InternalError("still in flight after Finish");
  // Without overlap: no stages, and StartParamSync gathers and waits on everything.
  options.overlap_param_gather = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> plain, MakeModel(comm, options));
  if (plain->sync->num_param_sync_stages() != 0) {
    return absl::InternalError("stages without overlap_param_gather");
  }
  RETURN_IF_ERROR(plain->sync->StartParamSync());
  if (plain->sync->param_sync_in_flight() ||
      Launched(*plain, BucketGroupEvent::Kind::kParamSyncWaited).size() != static_cast<size_t>(n)) {
    return absl::InternalError("StartParamSync without overlap did not gather and wait on all");
  }
  return absl::OkStatus();
}

// Sharded residency: a group starts kStale with no full params, is gathered (kInFlight, then
// kSynced with every rank's shard in the bucket) and released (kStale, memory freed).
absl::Status ShardedPhase(Communicator& comm) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> m, MakeModel(comm, {}, Residency::kSharded));
  BucketGroupSync& sync = *m->sync;
  if (sync.num_param_sync_stages() != 0) return absl::InternalError("sharded: stages");
  Group& group = sync.group(0, 0);
  ParamAndGradBuffer& buf = *m->buffers[0];
  const int bucket = group.buckets()[0];
  if (group.param_state() != Group::ParamState::kStale || buf.params_materialized(bucket)) {
    return absl::InternalError("sharded: a group starts gathered");
  }
  RETURN_IF_ERROR(group.StartParamSync());
  if (group.param_state() != Group::ParamState::kInFlight || !buf.params_materialized(bucket)) {
    return absl::InternalError("sharded: not in flight after StartParamSync");
  }
  RETURN_IF_ERROR(group.FinishParamSync());
  // Every param's initial value is arange(numel) (MakeModel); padding is zero. (The params
  // themselves alias released buckets: reading them would read freed memory.)
  at::Tensor expected = at::zeros({buf.layout().numel()}, at::kFloat);
  for (const layout::ParamPlacement& p : buf.layout().params) {
    expected.narrow(0, p.start, p.numel()).copy_(at::arange(p.numel(), at::kFloat));
  }
  const auto& b0 = buf.layout().buckets[bucket];
  if (group.param_state() != Group::ParamState::kSynced ||
      !at::equal(buf.ParamBucket(bucket), expected.narrow(0, b0.start, b0.numel()))) {
    return absl::InternalError("sharded: the gathered bucket differs");
  }
  RETURN_IF_ERROR(group.ReleaseParams());
  if (group.param_state() != Group::ParamState::kStale || buf.params_materialized(bucket) ||
      Launched(*m, BucketGroupEvent::Kind::kParamsReleased).size() != 1) {
    return absl::InternalError("sharded: not released");
  }
  return absl::OkStatus();
}

absl::Status ErrorsPhase(Communicator& comm) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> m, MakeModel(comm, {}));
  std::vector<ParamAndGradBuffer*> raw = {m->buffers[0].get()};
  const absl::Status mismatch = BucketGroupSync::Create(raw, {}, {}).status();
  if (mismatch.code() != absl::StatusCode::kInvalidArgument ||
      !absl::StrContains(mismatch.message(), "expected one per buffer")) {
    return absl::InternalError(absl::StrCat("no communicators gave ", mismatch.ToString()));
  }
  BucketGroupOptions all_reduce;
  all_reduce.grad_sync = GradSync::kAllReduce;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> sharded, MakeModel(comm, {}, Residency::kSharded));
  raw = {sharded->buffers[0].get()};
  const absl::Status refused = BucketGroupSync::Create(raw, {&comm}, all_reduce).status();
  if (refused.code() != absl::StatusCode::kInvalidArgument ||
      !absl::StrContains(refused.message(), "needs the reduce-scatter grad sync")) {
    return absl::InternalError(absl::StrCat("sharded all-reduce gave ", refused.ToString()));
  }
  return absl::OkStatus();
}

// The last rank never joins: the others' FinishGradSync times out naming the group and the
// collective.
absl::Status TimeoutPhase(Communicator& comm) {
  if (comm.rank() == comm.size() - 1) {
    sleep(8);
    return absl::OkStatus();
  }
  BucketGroupOptions options;
  options.timeout = absl::Seconds(2);
  ASSIGN_OR_RETURN(std::unique_ptr<Model> m, MakeModel(comm, options, Residency::kFull, true));
  const absl::Status status = m->sync->FinishGradSync();
  if (status.code() != absl::StatusCode::kDeadlineExceeded ||
      !absl::StrContains(status.message(), "grad reduce-scatter of buffer 0 (") ||
      !absl::StrContains(status.message(), "bucket group 0 (buckets 0) failed")) {
    return absl::InternalError(absl::StrCat("timeout gave ", status.ToString()));
  }
  if (!m->sync->group(0, 0).grad_sync_in_flight()) {
    return absl::InternalError("a timed-out grad sync is not in flight any more");
  }
  return absl::OkStatus();
}

class BucketGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(BucketGroupTest, AllPhasesPassOnEveryRank) {
  collectives::testing::RunOnRanks(GetParam(), [](Communicator& comm) {
    const std::vector<std::pair<std::string, std::function<absl::Status()>>> phases = {
        {"errors", [&] { return ErrorsPhase(comm); }},
        {"grad_sync", [&] { return GradSyncPhase(comm); }},
        {"param_sync", [&] { return ParamSyncPhase(comm); }},
        {"sharded", [&] { return ShardedPhase(comm); }},
        // Last: it leaves a collective unfinished (the harness ends the rank without teardown).
        {"timeout", [&] { return comm.size() > 1 ? TimeoutPhase(comm) : absl::OkStatus(); }},
    };
    for (const auto& [name, phase] : phases) {
      std::printf("bucket group phase %s starts on rank %d\n", name.c_str(), comm.rank());
      std::fflush(stdout);
      const absl::Status status = phase();
      ASSERT_TRUE(status.ok()) << "bucket group phase " << name << ": " << status;
      std::printf("bucket group phase %s passed on rank %d\n", name.c_str(), comm.rank());
      std::fflush(stdout);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BucketGroupTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

}  // namespace
}  // namespace orthoshard::buffers
