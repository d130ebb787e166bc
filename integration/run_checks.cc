#include "integration/run_checks.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "buffers/param_and_grad_buffer.h"
#include "common/dtype.h"
#include "common/exact_sum.h"
#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"
#include "integration/metrics/allocator_stats.h"
#include "integration/metrics/run_metrics.h"
#include "integration/rank_values.h"
#include "layout/layout.h"
#include "model/model.h"

namespace orthoshard::integration {
namespace {

using collectives::AllReduceOp;
using collectives::Communicator;
using collectives::ReduceOp;

// Adds every element of `t` (any float dtype, any device) to `sum`.
void AddToSum(const at::Tensor& t, ExactFloatSum& sum) {
  const at::Tensor values = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
  sum.Add(absl::MakeConstSpan(values.data_ptr<float>(), static_cast<size_t>(values.numel())));
}

// An exact sum's limbs as an int64 tensor on `device` (for a collective), and back.
at::Tensor LimbsTensor(const ExactFloatSum::Limbs& limbs, at::Device device) {
  return at::tensor(std::vector<int64_t>(limbs.begin(), limbs.end()), at::kLong).to(device);
}
ExactFloatSum::Limbs LimbsOf(const at::Tensor& t) {
  const at::Tensor cpu = t.cpu();
  ExactFloatSum::Limbs limbs;
  std::copy(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + limbs.size(), limbs.begin());
  return limbs;
}

// Whether this rank adds param `index` (of the model's list) to a checksum: a tensor-parallel
// slice always (the tp ranks' slices add up to the whole), a param every tp rank holds whole
// (norms) on tp rank 0 only, so that every element counts once.
bool CountedInChecksum(const Setup& s, int index) {
  return s.model->params()[index].tp.split() || s.mesh->tp().rank() == 0;
}

// The exact sum of the params of the dense buffers (expert = false) or the expert buffers, over the
// ranks of `copies`, which hold the same params (the dp group, or expt_dp), each param counted as
// CountedInChecksum says: with full residency each rank sums its own copy and compares it with
// rank 0's (a divergence fails the run; `*compared` is set); with sharded residency (fsdp) each
// holds only its shards, whose exact partial sums are added.
absl::StatusOr<ExactFloatSum> GroupChecksum(Setup& s, bool expert, Communicator& copies,
                                            int64_t step, bool* compared) {
  const bool sharded = SpecOf(s.mode).sharded_params;
  ExactFloatSum local;
  for (const buffers::ParamAndGradBuffer* buffer : s.buffers) {
    const layout::PerBufferParamLayout& l = buffer->layout();
    if (l.key.expert != expert) continue;
    for (int b = 0; b < buffer->num_buckets(); ++b) {
      // This rank's elements of the bucket: all of them, or its shard. Padding is zeros.
      const auto [begin, end] =
          sharded ? l.ShardRange(b, copies.rank()) : std::make_pair(l.buckets[b].start,
                                                                    l.buckets[b].end);
      const at::Tensor held = sharded ? buffer->ParamShard(b, copies.rank())
                                      : buffer->param_data().narrow(0, begin, end - begin);
      for (int i : buffer->BucketParams(b)) {
        const layout::ParamPlacement& p = l.params[i];
        const int64_t from = std::max(p.start, begin), to = std::min(p.end, end);
        if (from < to && CountedInChecksum(s, p.param_index)) {
          AddToSum(held.narrow(0, from - begin, to - from), local);
        }
      }
    }
  }
  const ExactFloatSum::Limbs limbs = local.limbs();
  at::Tensor agreed = LimbsTensor(limbs, copies.device());
  *compared = !sharded;
  if (sharded) {
    RETURN_IF_ERROR(RunGroup(copies, {AllReduceOp{agreed, {ReduceOp::kSum}}}));
  } else {
    RETURN_IF_ERROR(RunGroup(copies, {collectives::BroadcastOp{agreed, {0}}}));
  }
  ExactFloatSum total;
  total.Merge(LimbsOf(agreed));
  if (sharded) return total;
  at::Tensor flag = ScalarOn(copies, total.limbs() != limbs ? 1.0 : 0.0);
  RETURN_IF_ERROR(RunGroup(copies, {AllReduceOp{flag, {ReduceOp::kSum}}}));
  if (const double ranks = ValueOf(flag); ranks != 0) {
    return absl::InternalError(absl::StrFormat(
        "param checksum%s differs from rank 0's at step %d on %d rank(s) (this rank: %.17g vs "
        "%.17g)",
        expert ? " of the experts" : "", step, static_cast<int64_t>(ranks), local.ToDouble(),
        total.ToDouble()));
  }
  return total;
}

}  // namespace

absl::StatusOr<double> ParamChecksum(Setup& s, int64_t step, bool* compared) {
  at::NoGradGuard no_grad;
  RETURN_IF_ERROR(s.ddp->FinishParamSync());
  ASSIGN_OR_RETURN(ExactFloatSum dense,
                   GroupChecksum(s, /*expert=*/false, s.mesh->dp(), step, compared));
  at::Tensor slices = LimbsTensor(dense.limbs(), s.mesh->tp().device());
  RETURN_IF_ERROR(RunGroup(s.mesh->tp(), {AllReduceOp{slices, {ReduceOp::kSum}}}));
  ExactFloatSum total;
  total.Merge(LimbsOf(slices));
  if (!s.model->config().is_moe()) return total.ToDouble();
  ASSIGN_OR_RETURN(ExactFloatSum experts,
                   GroupChecksum(s, /*expert=*/true, s.mesh->expt_dp(), step, compared));
  at::Tensor all = LimbsTensor(experts.limbs(), s.mesh->ep().device());
  RETURN_IF_ERROR(RunGroup(s.mesh->ep(), {AllReduceOp{all, {ReduceOp::kSum}}}));
  total.Merge(LimbsOf(all));
  return total.ToDouble();
}

absl::StatusOr<std::vector<RankMemory>> GatherRankMemory(Setup& s, Communicator& comm) {
  const ddp::DdpMemory m = s.ddp->memory();
  const absl::StatusOr<ddp::TransientBound> bound = s.ddp->TransientBoundOf();  // fsdp only
  // The experts' params and grads as their buffers keep them (whole, or this rank's shards).
  int64_t expert_params = 0, expert_grads = 0, param_buffer = 0;
  std::set<std::string> expert_names;
  for (const buffers::ParamAndGradBuffer* buffer : s.buffers) {
    const layout::PerBufferParamLayout& l = buffer->layout();
    param_buffer += l.numel() * DTypeSize(l.key.param_dtype);
    if (!l.key.expert) continue;
    for (const layout::ParamPlacement& p : l.params) expert_names.insert(p.name);
    int64_t held = l.numel();
    if (buffer->residency() == buffers::Residency::kSharded) {
      held = 0;
      for (const layout::Bucket& bucket : l.buckets) held += bucket.shard_size;
    }
    expert_params += held * DTypeSize(l.key.param_dtype);
    expert_grads += held * DTypeSize(l.key.grad_dtype);
  }
  const int64_t expert_state = s.optimizer->state_bytes(
      [&](absl::string_view name) { return expert_names.count(std::string(name)) > 0; });
  // In RankMemory's field order, so that each row is the struct's fields in turn.
  const std::array<int64_t, 12> mine = {m.param_bytes,
                                        m.grad_bytes,
                                        s.optimizer->state_bytes(),
                                        m.peak_transient_bytes,
                                        MaxRssBytes(),
                                        CpuAllocatorStats().peak_bytes,
                                        expert_params,
                                        expert_grads,
                                        expert_state,
                                        static_cast<int64_t>(s.optimizer->ns_cost()),
                                        param_buffer,
                                        bound.ok() ? bound->total() : 0};
  at::Tensor rows = at::zeros({comm.size(), static_cast<int64_t>(mine.size())}, at::kLong);
  for (size_t i = 0; i < mine.size(); ++i) rows[comm.rank()][i].fill_(mine[i]);
  rows = rows.to(comm.device());
  RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{rows, {ReduceOp::kSum}}}));
  rows = rows.cpu();
  std::vector<RankMemory> out(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* row = rows[r].data_ptr<int64_t>();
    out[r] = {row[0], row[1], row[2], row[3], row[4],  row[5],
              row[6], row[7], row[8], row[9], row[10], row[11]};
  }
  return out;
}

}  // namespace orthoshard::integration
