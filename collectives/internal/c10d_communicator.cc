#include "collectives/internal/c10d_communicator.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <signal.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "collectives/internal/failure_reports.h"
#include "collectives/internal/ring.h"
#include "common/status_macros.h"

namespace orthoshard::collectives::internal_collectives {
namespace {

struct PendingOp {
  std::string name;                     // e.g. "reduce_scatter #6"
  int64_t seq = 0;                      // its collective sequence number
  c10::intrusive_ptr<c10d::Work> work;  // null when nothing goes on the wire (empty tensors)
  std::function<void()> finish;         // runs once every op of the group completed
};

class C10dWork : public Work {
 public:
  C10dWork(std::shared_ptr<GroupState> group, std::vector<PendingOp> ops, bool resumable_wait)
      : group_(std::move(group)), ops_(std::move(ops)), resumable_wait_(resumable_wait) {}

  absl::Status Wait(absl::Duration timeout) override {
    if (done_) return result_;
    const absl::Time deadline = absl::Now() + timeout;
    for (; next_ < ops_.size(); ++next_) {
      if (!ops_[next_].work) continue;
      absl::Status waited = WaitFor(ops_[next_], deadline, timeout);
      if (!waited.ok()) return waited;
    }
    for (PendingOp& op : ops_) {
      if (!op.finish) continue;
      try {
        op.finish();
      } catch (const std::exception& e) {
        return Fail(absl::InternalError(absl::StrCat(group_->Prefix(), op.name,
                                                     ": finishing step failed on ", Self(), ": ",
                                                     WhatOf(e))));
      }
    }
    done_ = true;
    result_ = absl::OkStatus();
    return result_;
  }

 private:
  std::string Self() const { return NameRank(group_->naming(), group_->rank()); }

  // Waits for `op` until `deadline`. A resumable engine wait is cut into slices of
  // kPeerFailurePoll, between which a peer that gave up on #op.seq (or earlier) fails it at once.
  absl::Status WaitFor(PendingOp& op, absl::Time deadline, absl::Duration timeout) {
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      try {
        op.work->wait(ToChrono(resumable_wait_ ? std::min(left, kPeerFailurePoll) : left));
        return absl::OkStatus();
      } catch (const std::exception& e) {
        const bool completed = op.work->isCompleted();  // before the diagnosis's wait
        if (!completed && resumable_wait_ && absl::Now() < deadline) {
          const std::string peer = group_->PeerGaveUp(op.seq);
          if (peer.empty()) continue;
          const std::string blame = group_->Diagnose(op.seq, kFailureReportWindow, true);
          return Fail(absl::UnavailableError(absl::StrCat(
              group_->Prefix(), op.name, " failed on ", Self(), ": ", peer,
              ", so it cannot complete", blame)));
        }
        return Failed(op, e, completed, timeout);
      }
    }
  }

  // The error of `op`'s engine wait, which threw `e`: kDeadlineExceeded when it had not completed
  // within `timeout` (a failure, and given up on, when `timeout` is at least the communicator's:
  // the engine's own timeout has then passed too), else kUnavailable.
  absl::Status Failed(const PendingOp& op, const std::exception& e, bool completed,
                      absl::Duration timeout) {
    const bool gave_up = completed || timeout >= group_->timeout();
    const std::string blame = group_->Diagnose(op.seq, kFailureReportWindow, gave_up);
    if (!completed) {
      absl::Status late = absl::DeadlineExceededError(
          absl::StrCat(group_->Prefix(), op.name, " did not complete within ",
                       absl::FormatDuration(timeout), " on ", Self(), blame));
      return gave_up ? Fail(std::move(late)) : late;
    }
    return Fail(absl::UnavailableError(absl::StrCat(group_->Prefix(), op.name, " failed on ",
                                                    Self(), ": ", WhatOf(e), blame)));
  }

  absl::Status Fail(absl::Status status) {
    group_->RecordFailure(status);
    done_ = true;
    result_ = std::move(status);
    return result_;
  }

  std::shared_ptr<GroupState> group_;
  std::vector<PendingOp> ops_;
  bool resumable_wait_ = false;  // EngineTraits::resumable_wait
  size_t next_ = 0;
  bool done_ = false;
  absl::Status result_;
};

absl::Status CheckTensor(const at::Tensor& t, const std::string& what,
                         const EngineTraits& traits) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(what, " is undefined"));
  if (t.device() != traits.device) {
    const std::string kind = traits.device.is_cpu() ? "CPU" : traits.device.str();
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a ", kind, " tensor for ",
                                                   traits.name, ", got ", t.device().str()));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be contiguous"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDtype(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  if (a.scalar_type() != b.scalar_type()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": output dtype ", c10::toString(b.scalar_type()),
                     " differs from input dtype ", c10::toString(a.scalar_type())));
  }
  return absl::OkStatus();
}

absl::Status CheckAvg(ReduceOp op, const at::Tensor& t, const std::string& what) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": avg needs a floating-point dtype, got ",
                                                   c10::toString(t.scalar_type())));
  }
  return absl::OkStatus();
}

int64_t Bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The shape of one row (the dims after dim 0) of `t`, for messages: "[3]", "[]".
std::string RowShape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes().slice(1), ","), "]");
}

// Whether the bytes of contiguous `a` and `b` overlap.
bool Overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a_begin = static_cast<const char*>(a.data_ptr());
  const auto* b_begin = static_cast<const char*>(b.data_ptr());
  return a_begin < b_begin + Bytes(b) && b_begin < a_begin + Bytes(a);
}

// The launch checks of an all-to-all over `size` ranks (communicator.h's AllToAllOp).
absl::Status CheckAllToAll(const AllToAllOp& op, int size, const EngineTraits& traits,
                           const std::string& what) {
  RETURN_IF_ERROR(CheckTensor(op.input, what + " input", traits));
  RETURN_IF_ERROR(CheckTensor(op.output, what + " output", traits));
  RETURN_IF_ERROR(CheckSameDtype(op.input, op.output, what));
  if (op.input.dim() == 0 || op.output.dim() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", op.input.dim() == 0 ? "input" : "output",
        " is 0-d; all_to_all splits rows along dim 0 (shape [N] or [N, ...])"));
  }
  if (op.input.sizes().slice(1) != op.output.sizes().slice(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": input rows have shape ", RowShape(op.input), ", output rows ",
                     RowShape(op.output), "; the dims after dim 0 must match"));
  }
  if (Overlap(op.input, op.output)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": input and output overlap in memory"));
  }
  absl::StatusOr<std::vector<int64_t>> splits =
      ResolveSplitSizes(op.options.input_split_sizes, op.input.size(0), size, "input");
  if (splits.ok()) {
    splits = ResolveSplitSizes(op.options.output_split_sizes, op.output.size(0), size, "output");
  }
  if (!splits.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", splits.status().message()));
  }
  return absl::OkStatus();
}

class C10dCommunicator : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend,
                   int rank, int size, Engine engine, GroupNaming naming)
      : backend_(std::move(backend)), timeout_(engine.timeout), traits_(engine.traits) {
    shared_ = std::make_shared<GroupState>(store, rank, size, naming, timeout_);
    origin_.store = std::move(store);
    origin_.engine = std::move(engine);
    origin_.naming = std::move(naming);
    if (traits_.ring_collectives && size > 1) {
      ring_ = std::make_unique<RingEngine>(backend_, rank, size, timeout_,
                                           RingEngine::kDefaultPieceBytes, shared_->naming());
    }
  }

  C10dOrigin& origin() { return origin_; }

  int rank() const override { return shared_->rank(); }
  int size() const override { return shared_->size(); }
  std::string backend_name() const override { return traits_.name; }
  absl::Duration timeout() const override { return timeout_; }
  at::Device device() const override { return traits_.device; }

  TrafficCounters traffic() const override {
    absl::MutexLock lock(&mu_);
    return traffic_;
  }

  absl::StatusOr<std::unique_ptr<Work>> LaunchGroup(std::vector<CollectiveOp> ops) override {
    if (ops.empty()) return absl::InvalidArgumentError("LaunchGroup: the group is empty");
    RETURN_IF_ERROR(CheckUsable());
    for (size_t i = 0; i < ops.size(); ++i) {
      RETURN_IF_ERROR(
          Validate(ops[i], absl::StrCat("op ", i, " (", OpKindName(KindOf(ops[i])), ")")));
    }
    const int64_t first = next_seq_;
    next_seq_ += static_cast<int64_t>(ops.size());
    PublishProgress(next_seq_ - 1);
    std::vector<PendingOp> pending;
    for (size_t i = 0; i < ops.size(); ++i) {
      const int64_t seq = first + static_cast<int64_t>(i);
      PendingOp op;
      op.seq = seq;
      op.name = absl::StrCat(OpKindName(KindOf(ops[i])), " #", seq);
      if (ops.size() > 1) absl::StrAppend(&op.name, " (op ", i, " of a group of ", ops.size(), ")");
      try {
        std::visit([&](auto& o) { Enqueue(o, op); }, ops[i]);
      } catch (const std::exception& e) {
        absl::Status refused = absl::InvalidArgumentError(absl::StrCat(
            shared_->Prefix(), op.name, ": ", traits_.name, " refused the launch: ", WhatOf(e)));
        shared_->RecordFailure(refused);
        return refused;
      }
      pending.push_back(std::move(op));
    }
    return std::unique_ptr<Work>(
        new C10dWork(shared_, std::move(pending), traits_.resumable_wait));
  }

  absl::StatusOr<std::unique_ptr<Work>> Barrier(const BarrierOptions& options) override {
    RETURN_IF_ERROR(CheckUsable());
    const int64_t seq = next_seq_++;
    PublishProgress(seq);
    PendingOp op;
    op.seq = seq;
    op.name = absl::StrCat("barrier #", seq);
    try {
      c10d::BarrierOptions c10d_options;
      c10d_options.timeout = ToChrono(timeout_);
      op.work = backend_->barrier(c10d_options);
    } catch (const std::exception& e) {
      absl::Status failed = absl::UnavailableError(
          absl::StrCat(shared_->Prefix(), op.name, ": launch failed: ", WhatOf(e)));
      shared_->RecordFailure(failed);
      return failed;
    }
    Count(OpKind::kBarrier, 0, 0);
    std::vector<PendingOp> pending;
    pending.push_back(std::move(op));
    return std::unique_ptr<Work>(
        new C10dWork(shared_, std::move(pending), traits_.resumable_wait));
  }

 private:
  // Errors: kFailedPrecondition once a collective failed, ending with that first failure.
  absl::Status CheckUsable() const {
    if (shared_->failed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          shared_->Prefix(), traits_.name, " communicator of ",
          NameRank(shared_->naming(), shared_->rank()),
          " is unusable after an earlier collective failed (destroy it and fail the job): ",
          shared_->FirstFailure().message()));
    }
    return absl::OkStatus();
  }

  // Lets peers name this rank when it falls behind. Best effort: once a write fails the store is
  // gone (its host, the launcher or rank 0, died), and this rank stops writing to it: each failed
  // write costs c10d retries and a warning with a backtrace, which slowed orphaned ranks 16-fold.
  // The job is then stopped by its launcher's death (pretrain: a SIGTERM) or by the next failed
  // collective, whose error says the store is unreachable.
  void PublishProgress(int64_t seq) {
    if (store_lost_) return;
    try {
      const std::string value = absl::StrCat(seq);
      shared_->store()->set(ProgressKey(shared_->rank()),
                            std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception&) {
      store_lost_ = true;
    }
  }

  // `bytes`: logical (the full tensor); `wire`: what this rank sends.
  void Count(OpKind kind, int64_t bytes, int64_t wire) {
    absl::MutexLock lock(&mu_);
    traffic_.calls[static_cast<int>(kind)] += 1;
    traffic_.bytes[static_cast<int>(kind)] += bytes;
    traffic_.wire_bytes[static_cast<int>(kind)] += wire;
  }

  // (N - 1)/N of `bytes` times `passes`: what one rank of a ring sends for a tensor of `bytes`
  // (1 pass: reduce-scatter, all-gather, broadcast; 2: all-reduce).
  int64_t RingShare(int64_t bytes, int passes) const {
    const int n = shared_->size();
    return n > 1 ? passes * (bytes / n) * (n - 1) : 0;
  }

  absl::Status Validate(const CollectiveOp& any, const std::string& what) const {
    const int size = shared_->size();
    const int rank = shared_->rank();
    if (const auto* op = std::get_if<AllReduceOp>(&any)) {
      RETURN_IF_ERROR(CheckTensor(op->tensor, what + " tensor", traits_));
      return CheckAvg(op->options.op, op->tensor, what);
    }
    if (const auto* op = std::get_if<ReduceScatterOp>(&any)) {
      RETURN_IF_ERROR(CheckTensor(op->input, what + " input", traits_));
      RETURN_IF_ERROR(CheckTensor(op->output, what + " output", traits_));
      RETURN_IF_ERROR(CheckSameDtype(op->input, op->output, what));
      RETURN_IF_ERROR(CheckAvg(op->options.op, op->input, what));
      if (op->options.op == ReduceOp::kMax) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": op max is offered for all-reduce only; expected sum or avg"));
      }
      auto sizes = ResolveShardSizes(op->options.shard_sizes, op->input.numel(), size);
      if (!sizes.ok())
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", sizes.status().message()));
      if (op->output.numel() != (*sizes)[rank]) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": output has ", op->output.numel(),
                                                       " elements, rank ", rank, "'s shard has ",
                                                       (*sizes)[rank]));
      }
      return absl::OkStatus();
    }
    if (const auto* op = std::get_if<AllGatherOp>(&any)) {
      RETURN_IF_ERROR(CheckTensor(op->input, what + " input", traits_));
      RETURN_IF_ERROR(CheckTensor(op->output, what + " output", traits_));
      RETURN_IF_ERROR(CheckSameDtype(op->input, op->output, what));
      auto sizes = ResolveShardSizes(op->options.shard_sizes, op->output.numel(), size);
      if (!sizes.ok())
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", sizes.status().message()));
      if (op->input.numel() != (*sizes)[rank]) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": input has ", op->input.numel(),
                                                       " elements, rank ", rank, "'s shard has ",
                                                       (*sizes)[rank]));
      }
      return absl::OkStatus();
    }
    if (const auto* op = std::get_if<AllToAllOp>(&any)) {
      return CheckAllToAll(*op, size, traits_, what);
    }
    const auto& op = std::get<BroadcastOp>(any);
    RETURN_IF_ERROR(CheckTensor(op.tensor, what + " tensor", traits_));
    if (op.options.root < 0 || op.options.root >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": root ", op.options.root, " is outside [0, ", size, ")"));
    }
    return absl::OkStatus();
  }

  void Enqueue(AllReduceOp& op, PendingOp& pending) {
    Count(OpKind::kAllReduce, Bytes(op.tensor), RingShare(Bytes(op.tensor), 2));
    at::Tensor tensor = op.tensor;
    const bool native_avg = op.options.op == ReduceOp::kAvg && traits_.native_avg;
    const c10d::ReduceOp engine_op = op.options.op == ReduceOp::kMax ? c10d::ReduceOp::MAX
                                     : native_avg                    ? c10d::ReduceOp::AVG
                                                                     : c10d::ReduceOp::SUM;
    if (tensor.numel() > 0) pending.work = EngineAllReduce(tensor, engine_op);
    if (op.options.op == ReduceOp::kAvg && !native_avg) {
      const int size = shared_->size();
      pending.finish = [tensor, size]() mutable { tensor.div_(size); };
    }
  }

  void Enqueue(ReduceScatterOp& op, PendingOp& pending) {
    const std::vector<int64_t> sizes =
        *ResolveShardSizes(op.options.shard_sizes, op.input.numel(), shared_->size());
    const int rank = shared_->rank();
    const int64_t element = static_cast<int64_t>(op.input.element_size());
    Count(OpKind::kReduceScatter, Bytes(op.input),
          ring_ ? RingEngine::ReduceScatterSentElements(sizes, rank) * element
                : RingShare(Bytes(op.input), traits_.native_reduce_scatter ? 1 : 2));
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += sizes[r];
    if (traits_.native_reduce_scatter) return NativeReduceScatter(op, sizes, offset, pending);
    at::Tensor input = op.input.view({-1});
    const int size = shared_->size();
    const bool avg = op.options.op == ReduceOp::kAvg;
    if (input.numel() > 0) {
      // The ring reduces shard r into place on rank r, and divides it there for AVG (so that an
      // all-gather of it later in the group reads the mean: communicator.h); without the ring, an
      // all-reduce of the whole.
      pending.work = ring_ ? ring_->ReduceScatter(input, sizes, pending.seq, avg ? size : 1)
                           : EngineAllReduce(input, c10d::ReduceOp::SUM);
    }
    const bool divide = avg && !ring_;
    at::Tensor output = op.output;
    const int64_t count = sizes[rank];
    pending.finish = [input, output, offset, count, divide, size]() mutable {
      if (count == 0) return;
      at::Tensor shard = input.narrow(0, offset, count);
      if (shard.data_ptr() != output.data_ptr()) output.view({-1}).copy_(shard);
      if (divide) output.div_(size);
    };
  }

  void Enqueue(AllGatherOp& op, PendingOp& pending) {
    const int size = shared_->size();
    const std::vector<int64_t> sizes =
        *ResolveShardSizes(op.options.shard_sizes, op.output.numel(), size);
    Count(OpKind::kAllGather, Bytes(op.output),
          ring_ ? RingEngine::AllGatherSentElements(sizes, shared_->rank()) *
                      static_cast<int64_t>(op.output.element_size())
                : RingShare(Bytes(op.output), 1));
    const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
    if (largest == 0) return;
    at::Tensor output = op.output.view({-1});
    at::Tensor input = op.input.view({-1});
    if (ring_) {
      pending.work = ring_->AllGather(input, output, sizes, pending.seq);
      return;
    }
    c10d::AllgatherOptions options;
    options.timeout = ToChrono(timeout_);
    if (std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == largest; })) {
      pending.work = backend_->_allgather_base(output, input, options);
      return;
    }
    // Uneven shards: gather shards padded to the largest, then unpack in Wait.
    at::Tensor padded_input = at::zeros({largest}, input.options());
    padded_input.narrow(0, 0, input.numel()).copy_(input);
    at::Tensor padded_output = at::empty({largest * size}, input.options());
    pending.work = backend_->_allgather_base(padded_output, padded_input, options);
    pending.finish = [output, padded_output, padded_input, sizes, largest]() mutable {
      int64_t offset = 0;
      for (size_t r = 0; r < sizes.size(); ++r) {
        if (sizes[r] > 0) {
          output.narrow(0, offset, sizes[r])
              .copy_(padded_output.narrow(0, static_cast<int64_t>(r) * largest, sizes[r]));
        }
        offset += sizes[r];
      }
    };
  }

  void Enqueue(BroadcastOp& op, PendingOp& pending) {
    Count(OpKind::kBroadcast, Bytes(op.tensor), RingShare(Bytes(op.tensor), 1));
    if (op.tensor.numel() == 0) return;
    std::vector<at::Tensor> tensors = {op.tensor};
    c10d::BroadcastOptions options;
    options.rootRank = op.options.root;
    options.timeout = ToChrono(timeout_);
    pending.work = backend_->broadcast(tensors, options);
  }

  // All-to-all by the engine (c10d's alltoall_base, rows along dim 0), always with explicit splits.
  // Wire bytes: every input row but those of this rank's own split, which is a local copy.
  void Enqueue(AllToAllOp& op, PendingOp& pending) {
    const int size = shared_->size();
    const int rank = shared_->rank();
    std::vector<int64_t> input_splits =
        *ResolveSplitSizes(op.options.input_split_sizes, op.input.size(0), size, "input");
    std::vector<int64_t> output_splits =
        *ResolveSplitSizes(op.options.output_split_sizes, op.output.size(0), size, "output");
    const int64_t rows = op.input.size(0);
    const int64_t row_bytes = rows > 0 ? Bytes(op.input) / rows : 0;
    Count(OpKind::kAllToAll, Bytes(op.input), (rows - input_splits[rank]) * row_bytes);
    c10d::AllToAllOptions options;
    options.timeout = ToChrono(timeout_);
    pending.work =
        backend_->alltoall_base(op.output, op.input, output_splits, input_splits, options);
  }

  // Reduce-scatter by the engine: uneven shards are staged in an input padded to the largest
  // shard per rank; the output is written in place when it is this rank's slot of an even input
  // (NCCL's in-place form), else through a staging buffer copied in Wait.
  void NativeReduceScatter(ReduceScatterOp& op, const std::vector<int64_t>& sizes, int64_t offset,
                           PendingOp& pending) {
    const int size = shared_->size();
    const int rank = shared_->rank();
    const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
    if (largest == 0) return;
    const bool avg = op.options.op == ReduceOp::kAvg;
    const bool even =
        std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == largest; });
    at::Tensor input = op.input.view({-1});
    at::Tensor output = op.output.view({-1});
    at::Tensor send = input;
    if (!even) {
      send = at::zeros({largest * size}, input.options());
      int64_t start = 0;
      for (int r = 0; r < size; ++r) {
        if (sizes[r] > 0) {
          send.narrow(0, static_cast<int64_t>(r) * largest, sizes[r])
              .copy_(input.narrow(0, start, sizes[r]));
        }
        start += sizes[r];
      }
    }
    // With even shards, `offset` is rank * largest: the slot NCCL writes in place.
    const bool aliased = output.is_alias_of(input);
    const bool own_slot =
        even && aliased && output.data_ptr() == input.narrow(0, offset, largest).data_ptr();
    at::Tensor recv =
        even && (own_slot || !aliased) ? output : at::empty({largest}, input.options());
    c10d::ReduceScatterOptions options;
    options.reduceOp = avg && traits_.native_avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    options.timeout = ToChrono(timeout_);
    pending.work = backend_->_reduce_scatter_base(recv, send, options);
    const bool divide = avg && !traits_.native_avg;
    const int64_t count = sizes[rank];
    pending.finish = [recv, output, count, divide, size]() mutable {
      if (count == 0) return;
      if (recv.data_ptr() != output.data_ptr()) output.copy_(recv.narrow(0, 0, count));
      if (divide) output.div_(size);
    };
  }

  c10::intrusive_ptr<c10d::Work> EngineAllReduce(const at::Tensor& tensor, c10d::ReduceOp op) {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    options.timeout = ToChrono(timeout_);
    return backend_->allreduce(tensors, options);
  }

  std::shared_ptr<GroupState> shared_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  absl::Duration timeout_;
  bool store_lost_ = false;  // a progress write failed; no more are tried
  EngineTraits traits_;
  C10dOrigin origin_;  // what it was created with, for subgroups
  int64_t next_seq_ = 1;
  mutable absl::Mutex mu_;
  TrafficCounters traffic_;
  // Engines without a real reduce-scatter (Gloo): reduce-scatter and all-gather as rings over the
  // engine's send/recv. Declared last: destroyed first, while the backend is still alive.
  std::unique_ptr<RingEngine> ring_;
};

}  // namespace

std::string WhatOf(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

void IgnoreSigpipe() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

absl::Status CheckRankAndTimeouts(const char* engine, int rank, int size, absl::Duration timeout,
                                  absl::Duration rendezvous_timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(engine, ": rank ", rank,
                                                   " must be in [0, size) with size ", size,
                                                   " >= 1"));
  }
  if (timeout <= absl::ZeroDuration() || rendezvous_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        engine, ": timeouts must be positive, got timeout ", absl::FormatDuration(timeout),
        " and rendezvous_timeout ", absl::FormatDuration(rendezvous_timeout)));
  }
  return absl::OkStatus();
}

std::string NameRank(const GroupNaming& naming, int rank, const std::string& detail) {
  std::string inside;
  if (rank >= 0 && rank < static_cast<int>(naming.global_ranks.size())) {
    inside = absl::StrCat("global ", naming.global_ranks[rank]);
  }
  if (!detail.empty()) inside = inside.empty() ? detail : absl::StrCat(inside, ", ", detail);
  if (inside.empty()) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " (", inside, ")");
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectC10dCommunicator(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, Engine engine,
    GroupNaming naming) {
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Backend> backend, engine.connect(store, rank, size));
  return std::unique_ptr<Communicator>(new C10dCommunicator(
      std::move(store), std::move(backend), rank, size, std::move(engine), std::move(naming)));
}

C10dOrigin* OriginOf(Communicator& comm) {
  auto* c10d = dynamic_cast<C10dCommunicator*>(&comm);
  return c10d == nullptr ? nullptr : &c10d->origin();
}

}  // namespace orthoshard::collectives::internal_collectives
