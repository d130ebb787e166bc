#include "checkpoint/distributed_checkpoint.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "buffers/bucket_sync.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "checkpoint/internal/state_records.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard.h"
#include "checkpoint/tp_slices.h"
#include "common/status_macros.h"
#include "layout/layout.h"

namespace orthoshard::checkpoint {
namespace {

using optimizers::StateRecord;
using internal_checkpoint::BytesOf;
using internal_checkpoint::DTypeOf;
using internal_checkpoint::HeldParam;
using internal_checkpoint::kFullShapePrefix;
using internal_checkpoint::kStatePrefix;
using internal_checkpoint::ReadParamSlice;
using internal_checkpoint::StateParam;





std::string ShardFileName(int rank) { return absl::StrCat("rank", rank, ".safetensors"); }
std::string PartFileName(int rank) { return absl::StrCat("rank", rank, ".records.binpb"); }

// Rank whose shard of the param's bucket holds its first element.
int FirstElementOwner(const layout::PerBufferParamLayout& layout, const layout::ParamPlacement& p) {
  const layout::Bucket& b = layout.buckets[p.bucket];
  return static_cast<int>((p.start - b.start) / b.shard_size);
}

using collectives::AllRanksOk;

// The group `buffer` is sharded over: `expert_comm` for an expert buffer (layout key.expert) when
// given, `dense` (tp.dp_comm, or the world without tensor parallelism) otherwise.
collectives::Communicator& GroupOf(const buffers::ParamAndGradBuffer& buffer,
                                   collectives::Communicator& dense,
                                   collectives::Communicator* expert_comm) {
  return buffer.layout().key.expert && expert_comm != nullptr ? *expert_comm : dense;
}

collectives::Communicator& DenseGroup(const TensorParallelism& tp,
                                      collectives::Communicator& comm) {
  return tp.dp_comm != nullptr ? *tp.dp_comm : comm;
}

// This run's split of param `name` (replicated when `tp` lists none).
TpSplit SplitFor(const TensorParallelism& tp, const std::string& name) {
  auto it = tp.splits.find(name);
  return it == tp.splits.end() ? TpSplit{} : it->second;
}

// kInvalidArgument naming a param whose split's size or rank is not `tp`'s.
absl::Status CheckTensorParallelism(const TensorParallelism& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism: rank ", tp.rank, " of a tp group of ", tp.size));
  }
  for (const auto& [name, split] : tp.splits) {
    if (split.dim >= 0 && (split.size != tp.size || split.rank != tp.rank)) {
      return absl::InvalidArgumentError(absl::StrCat("param '", name, "': tp split (",
                                                     split.ToString(), ") is not this rank's (",
                                                     tp.rank, " of ", tp.size, ")"));
    }
  }
  return absl::OkStatus();
}


// A host copy of `t` (contiguous, owning its memory) for the writer: the live tensor may be on a
// GPU and keeps changing while the shard is written in the background.
at::Tensor HostCopy(const at::Tensor& t) {
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

// Whether a param of `bucket` crosses a shard boundary, so that no rank holds it whole in a
// sharded buffer (the same answer on every rank).
bool BucketHasStraddler(const buffers::ParamAndGradBuffer& buffer, int bucket) {
  for (int i : buffer.BucketParams(bucket)) {
    const layout::ParamPlacement& p = buffer.layout().params[i];
    if (p.numel() > 0 && buffer.layout().OwnerOf(p) < 0) return true;
  }
  return false;
}

// Appends a host copy of every param of `bucket` whose first element this rank owns, by its rank in
// `comm`, the group the buffer is sharded over (for an expert buffer the expert data-parallel
// group, so each ep rank writes its own experts and, among the copies of those, the owner of each
// shard writes). With sharded residency a param inside this rank's shard is copied from the shard;
// a bucket with a param that straddles shards is all-gathered first over `comm` (collective: every
// rank of the group gathers the same buckets). A tp-split param is saved as this tp rank's slice;
// a replicated one on tp rank 0 only.
absl::Status SnapshotParams(buffers::ParamAndGradBuffer& buffer, int bucket,
                            collectives::Communicator& comm, const TensorParallelism& tp,
                            RankSnapshot& snap) {
  const layout::PerBufferParamLayout& layout = buffer.layout();
  const int rank = comm.rank();
  const bool sharded = buffer.residency() == buffers::Residency::kSharded;
  const bool gather = sharded && BucketHasStraddler(buffer, bucket);
  const bool was_materialized = buffer.params_materialized(bucket);
  if (gather) {
    buffer.MaterializeParams(bucket);
    ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work,
                     comm.LaunchGroup(buffers::ParamSyncOps(buffer, {bucket}, rank)));
    RETURN_IF_ERROR(work->Wait(comm.timeout()));
  }
  const int64_t shard_begin = layout.ShardRange(bucket, rank).first;
  for (int i : buffer.BucketParams(bucket)) {
    const layout::ParamPlacement& p = layout.params[i];
    if (FirstElementOwner(layout, p) != rank) continue;
    const TpSplit split = SplitFor(tp, p.name);
    if (!split.split() && tp.rank != 0) continue;
    const at::Tensor live = !sharded || gather ? buffer.Param(i)
                                               : buffer.ParamShard(bucket, rank)
                                                     .narrow(0, p.start - shard_begin, p.numel())
                                                     .view(buffer.Param(i).sizes());
    at::Tensor t = HostCopy(live);
    ASSIGN_OR_RETURN(std::string dtype, DTypeOf(t.scalar_type()));
    snap.tensors.push_back(t);
    if (split.split()) {
      snap.records.push_back({p.name, TpParamKind(split.rank), dtype, t.sizes().vec(), BytesOf(t),
                              MakeTpSlice(split, TpGlobalShape(t.sizes().vec(), split))});
    } else {
      snap.records.push_back({p.name, kParamKind, dtype, t.sizes().vec(), BytesOf(t)});
    }
  }
  if (gather && !was_materialized) buffer.ReleaseParams(bucket);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankSnapshot> SnapshotRank(const SharedState& shared,
                                          absl::Span<buffers::ParamAndGradBuffer* const> buffers,
                                          const optimizers::OptimizerState& optimizer,
                                          collectives::Communicator& comm,
                                          collectives::Communicator* expert_comm,
                                          const TensorParallelism& tp) {
  RETURN_IF_ERROR(CheckTensorParallelism(tp));
  RankSnapshot snap;
  snap.rank = comm.rank();
  snap.step = shared.step;
  const int rank = snap.rank;
  collectives::Communicator& dense = DenseGroup(tp, comm);
  try {
    absl::flat_hash_map<std::string, std::vector<int64_t>> local_shapes;  // split params only
    for (buffers::ParamAndGradBuffer* buffer : buffers) {
      for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
        const std::string& name = buffer->layout().params[i].name;
        if (SplitFor(tp, name).split()) local_shapes[name] = buffer->Param(i).sizes().vec();
      }
      for (int b = 0; b < buffer->num_buckets(); ++b) {
        RETURN_IF_ERROR(
            SnapshotParams(*buffer, b, GroupOf(*buffer, dense, expert_comm), tp, snap));
      }
    }
    for (const StateRecord& s : optimizer.ExportState()) {  // clones: only a device copy is new
      // Elementwise state of a split param (the param's local shape) is this tp rank's slice;
      // everything else is the same on every tp rank and saved by tp rank 0.
      const std::string param = StateParam(s.name);
      const auto local = local_shapes.find(param);
      const bool sliced = local != local_shapes.end() && s.full_shape == local->second;
      if (!sliced && tp.rank != 0) continue;
      at::Tensor t = s.tensor.device().is_cpu() ? s.tensor.contiguous() : HostCopy(s.tensor);
      ASSIGN_OR_RETURN(std::string dtype, DTypeOf(t.scalar_type()));
      snap.tensors.push_back(t);
      snap.records.push_back({s.name, absl::StrCat(kStatePrefix, s.offset, ".rank", rank), dtype,
                              t.sizes().vec(), BytesOf(t)});
      if (sliced) {
        const TpSplit split = SplitFor(tp, param);
        snap.records.back().tp = MakeTpSlice(split, TpGlobalShape(s.full_shape, split));
      }
      snap.full_shapes.emplace_back(s.name, absl::StrJoin(s.full_shape, ","));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("snapshot for checkpoint step ", shared.step, ": ",
                                            e.what_without_backtrace()));
  }
  return snap;
}

absl::Status WriteRankSnapshot(const std::string& tmp, const RankSnapshot& snap) {
  Manifest part;
  for (const auto& [name, shape] : snap.full_shapes) {
    (*part.mutable_metadata())[absl::StrCat(kFullShapePrefix, name)] = shape;
  }
  ASSIGN_OR_RETURN(std::vector<TensorRecord> written,
                   WriteShard(tmp, ShardFileName(snap.rank), snap.records));
  for (TensorRecord& r : written) *part.add_tensors() = std::move(r);
  return WriteFileAtomically(JoinPath(tmp, PartFileName(snap.rank)), part.SerializeAsString());
}

namespace {

// Rank 0: merges every rank's part into the manifest, removes the parts, commits.
absl::Status MergeAndCommit(const std::string& root, const std::string& tmp,
                            const SharedState& shared,
                            absl::Span<buffers::ParamAndGradBuffer* const> buffers, int world,
                            int dp, int tp, const SaveOptions& options) {
  Manifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_step(shared.step);
  std::vector<std::string> strategies;
  for (buffers::ParamAndGradBuffer* b : buffers) {
    strategies.push_back(layout::StrategyName(b->layout().strategy));
  }
  manifest.set_layout_strategy(absl::StrJoin(strategies, ","));
  manifest.set_dp_size(dp);
  manifest.set_tp_size(tp);
  manifest.set_model_config(shared.model_config);
  manifest.set_optimizer_config(shared.optimizer_config);
  auto& meta = *manifest.mutable_metadata();
  meta["step"] = absl::StrCat(shared.step);
  meta["data_position"] = absl::Base64Escape(shared.data_position);
  meta["rng_seed"] = absl::StrCat(shared.rng_seed);
  // Every record is written once over all ranks (params by their shard's owner in the buffer's
  // group, tp slices by their tp rank's, state pieces by kind "state@<offset>.rank<r>"); a second
  // writer would be a bug in who writes what, and a load would read one of the two at random.
  std::map<std::pair<std::string, std::string>, std::string> writer;  // (name, kind) -> file
  for (int r = 0; r < world; ++r) {
    const std::string path = JoinPath(tmp, PartFileName(r));
    ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
    Manifest part;
    if (!part.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("record list ", path, " does not parse"));
    }
    for (TensorRecord& t : *part.mutable_tensors()) {
      const auto [it, fresh] = writer.emplace(std::make_pair(t.name(), t.kind()), t.file());
      if (!fresh) {
        return absl::InternalError(absl::StrCat("checkpoint step ", shared.step, ": tensor '",
                                                t.name(), "' (", t.kind(), ") written by both ",
                                                it->second, " and ", t.file()));
      }
      *manifest.add_tensors() = std::move(t);
    }
    for (const auto& [k, v] : part.metadata()) meta[k] = v;
    RETURN_IF_ERROR(RemoveRecursively(path));
  }
  // Every tp-split param has all its slices, of one split (else the checkpoint could not be read).
  if (absl::StatusOr<std::vector<WholeParam>> params = WholeParams(manifest, tmp); !params.ok()) {
    return absl::InternalError(absl::StrCat("checkpoint step ", shared.step, ": ",
                                            params.status().message()));
  }
  RETURN_IF_ERROR(WriteManifest(tmp, manifest));
  CommitOptions commit;
  commit.keep_last = options.keep_last;
  return CommitCheckpoint(root, shared.step, commit);
}


absl::StatusOr<SharedState> ReadShared(const CheckpointReader& reader) {
  const Manifest& m = reader.manifest();
  SharedState shared;
  shared.step = m.step();
  shared.model_config = m.model_config();
  shared.optimizer_config = m.optimizer_config();
  auto get = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = m.metadata().find(key);
    if (it == m.metadata().end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", reader.dir(), ": manifest metadata lacks '", key, "'"));
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string pos, get("data_position"));
  ASSIGN_OR_RETURN(std::string seed, get("rng_seed"));
  if (!absl::Base64Unescape(pos, &shared.data_position) ||
      !absl::SimpleAtoi(seed, &shared.rng_seed)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", reader.dir(), ": bad data_position or rng_seed metadata"));
  }
  return shared;
}

// A param record this rank must apply: its bytes and the buffer range it covers.
struct ParamLoad {
  buffers::ParamAndGradBuffer* buffer;
  int index;
  at::Tensor value;  // whole param, read and checked
};


// Reads (and checks) the param records whose elements fall in this rank's shards, its rank in each
// buffer's group deciding (dense buffers: `dense`); each param this run splits over tp is read as
// its local slice. Touches nothing live.
absl::Status ReadOwnedParams(const CheckpointReader& reader,
                             absl::Span<buffers::ParamAndGradBuffer* const> buffers,
                             collectives::Communicator& dense,
                             collectives::Communicator* expert_comm, const TensorParallelism& tp,
                             std::vector<ParamLoad>& params) {
  for (buffers::ParamAndGradBuffer* buffer : buffers) {
    const layout::PerBufferParamLayout& layout = buffer->layout();
    const int rank = GroupOf(*buffer, dense, expert_comm).rank();
    for (int i = 0; i < static_cast<int>(layout.params.size()); ++i) {
      const layout::ParamPlacement& p = layout.params[i];
      const auto [lo, hi] = layout.ShardRange(p.bucket, rank);
      if (std::max(lo, p.start) >= std::min(hi, p.end)) continue;  // not in this rank's shard
      const at::Tensor& live = buffer->Param(i);
      ASSIGN_OR_RETURN(std::string dtype, DTypeOf(live.scalar_type()));
      at::Tensor value = at::empty(live.sizes(), live.scalar_type());
      RETURN_IF_ERROR(ReadParamSlice(reader, p.name, dtype, SplitFor(tp, p.name), value));
      params.push_back({buffer, i, value});
    }
  }
  return absl::OkStatus();
}





// The param sync after a load: dense buffers over `comm` (the dense group), then expert buffers
// over `expert_comm` (the same order on every rank).
absl::Status SyncLoadedParams(absl::Span<buffers::ParamAndGradBuffer* const> buffers,
                              collectives::Communicator& comm,
                              collectives::Communicator* expert_comm) {
  std::vector<buffers::ParamAndGradBuffer*> dense, experts;
  for (buffers::ParamAndGradBuffer* b : buffers) {
    (&GroupOf(*b, comm, expert_comm) == &comm ? dense : experts).push_back(b);
  }
  ASSIGN_OR_RETURN(auto works, buffers::LaunchParamSync(comm, dense));
  RETURN_IF_ERROR(buffers::WaitAll(works, comm.timeout()));
  if (experts.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(works, buffers::LaunchParamSync(*expert_comm, experts));
  return buffers::WaitAll(works, expert_comm->timeout());
}

}  // namespace

absl::Status SaveDistributedCheckpoint(
    const std::string& root, const SharedState& shared,
    absl::Span<buffers::ParamAndGradBuffer* const> buffers,
    const optimizers::OptimizerState& optimizer,
    collectives::Communicator& comm, const SaveOptions& options,
    collectives::Communicator* expert_comm, const TensorParallelism& tp) {
  AsyncCheckpointSaver saver(&comm, expert_comm, tp);
  RETURN_IF_ERROR(saver.Start(root, shared, buffers, optimizer, options));
  return saver.Finalize();
}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  if (thread_.joinable()) thread_.join();
}

absl::Status AsyncCheckpointSaver::Start(
    const std::string& root, const SharedState& shared,
    absl::Span<buffers::ParamAndGradBuffer* const> buffers,
    const optimizers::OptimizerState& optimizer,
    const SaveOptions& options) {
  RETURN_IF_ERROR(Finalize());
  collectives::Communicator& comm = *comm_;
  absl::Status begin = absl::OkStatus();
  if (comm.rank() == 0) begin = BeginCheckpoint(root, shared.step).status();
  ASSIGN_OR_RETURN(bool begun, AllRanksOk(comm, begin.ok()));
  if (!begin.ok()) return begin;
  if (!begun) return absl::AbortedError("rank 0 failed to begin the checkpoint");
  root_ = root;
  shared_ = shared;
  buffers_.assign(buffers.begin(), buffers.end());
  options_ = options;
  pending_ = true;
  // A snapshot that fails is this rank's write failure: Finalize tells every rank, as for a write.
  absl::StatusOr<RankSnapshot> snapshot =
      SnapshotRank(shared, buffers, optimizer, comm, expert_comm_, tp_);
  if (!snapshot.ok()) {
    write_status_ = snapshot.status();
    write_finished_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }
  snapshot_ = *std::move(snapshot);
  write_status_ = absl::OkStatus();
  const std::string tmp = JoinPath(root, StepDirName(shared.step) + ".tmp");
  write_finished_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this, tmp] {
    write_status_ = WriteRankSnapshot(tmp, snapshot_);
    if (write_status_.ok() && options_.after_shard_written) {
      write_status_ = options_.after_shard_written();
    }
    write_finished_.store(true, std::memory_order_release);
  });
  return absl::OkStatus();
}

absl::Status AsyncCheckpointSaver::Finalize() {
  if (!pending_) return absl::OkStatus();
  pending_ = false;
  if (thread_.joinable()) thread_.join();
  snapshot_ = RankSnapshot();  // frees the host copies
  collectives::Communicator& comm = *comm_;
  const absl::Status write = write_status_;
  ASSIGN_OR_RETURN(bool all_written, AllRanksOk(comm, write.ok()));
  if (!write.ok()) return write;
  if (!all_written) return absl::AbortedError("another rank failed to write its shard");
  const std::string tmp = JoinPath(root_, StepDirName(shared_.step) + ".tmp");
  absl::Status commit = absl::OkStatus();
  if (comm.rank() == 0) {
    commit = MergeAndCommit(root_, tmp, shared_, buffers_, comm.size(),
                            DenseGroup(tp_, comm).size(), tp_.size, options_);
  }
  ASSIGN_OR_RETURN(bool committed, AllRanksOk(comm, commit.ok()));
  if (!commit.ok()) return commit;
  if (!committed) return absl::AbortedError("rank 0 failed to commit the checkpoint");
  return absl::OkStatus();
}

absl::StatusOr<SharedState> LoadDistributedCheckpoint(
    const std::string& path, absl::Span<buffers::ParamAndGradBuffer* const> buffers,
    optimizers::OptimizerState& optimizer,
    collectives::Communicator& comm, collectives::Communicator* expert_comm,
    const TensorParallelism& tp) {
  std::vector<ParamLoad> params;
  collectives::Communicator& dense = DenseGroup(tp, comm);
  std::vector<StateRecord> state;
  absl::StatusOr<SharedState> shared = absl::UnknownError("unset");
  absl::Status read = [&]() -> absl::Status {
    try {
      ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(path));
      RETURN_IF_ERROR(CheckTensorParallelism(tp));
      ASSIGN_OR_RETURN(shared, ReadShared(reader));
      RETURN_IF_ERROR(ReadOwnedParams(reader, buffers, dense, expert_comm, tp, params));
      absl::flat_hash_map<std::string, HeldParam> held;
      for (const buffers::ParamAndGradBuffer* buffer : buffers) {
        for (int i = 0; i < static_cast<int>(buffer->layout().params.size()); ++i) {
          const std::string& name = buffer->layout().params[i].name;
          held[name] = {SplitFor(tp, name), buffer->Param(i).sizes().vec()};
        }
      }
      return internal_checkpoint::ReadState(reader, held, state);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("loading ", path, ": ", e.what_without_backtrace()));
    }
  }();
  ASSIGN_OR_RETURN(bool all_read, AllRanksOk(comm, read.ok()));
  if (!read.ok()) return read;
  if (!all_read) return absl::AbortedError("another rank failed to load the checkpoint");

  // Everything is read and checked on every rank: now change live state.
  absl::Status imported = optimizer.ImportState(state);
  ASSIGN_OR_RETURN(bool all_imported, AllRanksOk(comm, imported.ok()));
  if (!imported.ok()) return imported;
  if (!all_imported) return absl::AbortedError("another rank failed to import optimizer state");
  try {
    for (ParamLoad& p : params) {
      const layout::ParamPlacement& placement = p.buffer->layout().params[p.index];
      const int rank = GroupOf(*p.buffer, dense, expert_comm).rank();
      const auto [lo, hi] = p.buffer->layout().ShardRange(placement.bucket, rank);
      const int64_t b = std::max(lo, placement.start);
      const int64_t e = std::min(hi, placement.end);
      p.buffer->ParamShard(placement.bucket, rank)
          .narrow(0, b - lo, e - b)
          .copy_(p.value.reshape({-1}).narrow(0, b - placement.start, e - b));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading ", path, ": ", e.what_without_backtrace()));
  }
  RETURN_IF_ERROR(SyncLoadedParams(buffers, dense, expert_comm));
  return shared;
}

}  // namespace orthoshard::checkpoint
