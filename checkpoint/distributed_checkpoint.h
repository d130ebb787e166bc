// Distributed save and load of a training run: every data-parallel rank writes only what it owns
// into one safetensors shard of a `step_N.tmp/` directory, rank 0 merges every rank's record list
// into the manifest and commits (commit.h), and a later run at ANY data-parallel size, layout
// strategy or mode (sharded or replicated) reads back what it now owns.
//
// What is saved, per parameter and by name, in model space (never "rank r's slice of buffer b"):
//   param     kind "param": the whole model param, written by ONE rank: the rank whose shard holds
//             the param's first element (its OwnerOf owner for shard-aligned layouts; for a ZeRO-1
//             param straddling shards, the owner of the first element). Save must run after the
//             param sync, when every rank holds every param, so the whole param is available there.
//             Buffers with sharded residency (ZeRO-3) hold no full params between steps: a param
//             inside the writer's shard is read from the shard, and a bucket holding a param that
//             straddles shards is all-gathered into its transient storage for the snapshot, one
//             bucket at a time, and released again (so saves are collective in either case).
//   state     kind "state@<offset>.rank<r>": one StateRecord of the optimizer's ExportState
//             (optimizers/state.h: "<param>/exp_avg", "<param>/main_param", "chained/step", ...),
//             i.e. the flattened piece rank r saves, starting at element
//             <offset> of the whole tensor. The record's global_shape is the SLICE's shape (the
//             manifest requires length == shape × dtype size); the whole tensor's shape is kept in
//             the manifest metadata as "full_shape/<name>" = "48,16" ("" for a scalar).
//   shared    rank 0 only, in the manifest: step, data loader position (opaque bytes, base64 in
//             metadata "data_position"), RNG seed ("rng_seed"), model and optimizer configs.
//
// Experts (MoE). With expert parallelism a rank holds only its ep rank's experts (under their
// global names), in expert buffers (layout key.expert) sharded over the expert data-parallel group
// `expert_comm` (expt_dp = dp / ep ranks holding the same experts); dense buffers are sharded over
// `comm`. Everything "by rank" above is then by the rank in the buffer's group: an expert param is
// written by the expt_dp rank whose shard holds its first element (each ep rank writes its own
// experts), the optimizer's expert slots are those of its expt_dp rank (so their state pieces, too,
// are saved once), and the merged manifest lists every rank's records, each (name, kind) exactly
// once (a second writer fails the commit). A load reads the records of the params this rank holds,
// by global name, whatever (dp, ep) saved them, and skips the state of saved params it does not
// hold; so a checkpoint resumes at any (dp, ep), and a single-process reader (ckpt) sees one model
// with every expert.
//
// Load reads, on each rank, the param records whose elements fall in this rank's shards of the
// new layout (all CRC-32C checked), and every optimizer state record of the params it holds
// (ImportState picks out what this rank now owns from the reassembled slices). Only when every
// rank has read and checked all of its records (agreed through an all-reduce) does anything live
// change: the optimizer state is imported, the owned param elements are copied into this rank's
// shards, and the param all-gather runs so every rank holds the same params (buffers with sharded
// residency are gathered by the next forward instead).
//
// SaveDistributedCheckpoint is synchronous. AsyncCheckpointSaver snapshots to host memory
// synchronously and writes the shard on a background thread while training goes on; the commit
// (barrier, manifest merge, rename, `latest`) runs on the caller's thread at the next Start or at
// Finalize, because the communicator is not thread-safe and training keeps using it.
// Tensor parallelism (TensorParallelism below). Every rank of the tp x dp world takes part in the
// save and commit (`comm` is the world; files rank<world rank>.safetensors); dense buffers are
// sharded over the dp group, and "by rank" above means by the rank in it. A tp-split param is
// saved by the dp owner on EVERY tp rank, each its slice (kind "param@tp<r>", checkpoint/
// tp_slices.h), and so are the pieces of its elementwise optimizer state (its local shape: the
// record carries the split and the whole shape); everything else (replicated params, their
// state, non-elementwise state such as step counts) is saved by tp rank 0's ranks alone, as a
// run without tensor parallelism would. The commit refuses a split param whose slices are not
// all there. A load at any (tp', dp') builds each local param and elementwise state tensor it
// needs from the saved slices whose runs overlap it (reading only those records), after checking
// that the model's whole shapes are the checkpoint's. A checkpoint saved without tensor
// parallelism is one whose params are all whole.
//
// All functions are collective: every rank of `comm` must call them with the same arguments (and,
// for experts, the same `expert_comm` role: null on every rank, or each rank's expert
// data-parallel group, a subgroup of `comm`'s ranks; null means `comm` for every buffer).
#ifndef ORTHOSHARD_CHECKPOINT_DISTRIBUTED_CHECKPOINT_H_
#define ORTHOSHARD_CHECKPOINT_DISTRIBUTED_CHECKPOINT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "buffers/param_and_grad_buffer.h"
#include "checkpoint/shard.h"
#include "absl/container/flat_hash_map.h"
#include "collectives/communicator.h"
#include "common/tp_split.h"
#include "optimizers/state.h"

namespace orthoshard::checkpoint {

// The run state that is not a tensor; saved by rank 0, returned to every rank by Load.
struct SharedState {
  int64_t step = 0;            // training steps completed
  std::string data_position;   // opaque data loader position (any bytes)
  uint64_t rng_seed = 0;
  std::string model_config;    // serialized by the model's owner
  std::string optimizer_config;
};

// The tensor parallelism of the run that saves or loads; the default is none (tp 1).
struct TensorParallelism {
  // The group the dense buffers are sharded over (the mesh's dp) when the functions' `comm` is the
  // whole tp x dp world; null: `comm` itself.
  collectives::Communicator* dp_comm = nullptr;
  int size = 1;  // ranks in this rank's tp group
  int rank = 0;  // this rank's index in it
  // Every tp-split param's split (ModelParam::tp / layout::ParamSpec::tp: size and rank as above),
  // by model-space name. A param not listed, or listed replicated, is the same on every tp rank.
  absl::flat_hash_map<std::string, TpSplit> splits;
};

struct SaveOptions {
  // Complete checkpoints kept after the commit (0 keeps all); see CommitOptions.
  int keep_last = 3;
  // Fault-injection hook for tests: called on every rank after its shard is written and fsynced,
  // before the barrier; a non-OK result counts as that rank's write failure (the crash-safety
  // test kills a rank here instead). Leave empty in production.
  std::function<absl::Status()> after_shard_written;
};

// Saves step `shared.step` under `root` (root/step_NNNNNN/, then `latest`) and returns when it is
// committed: AsyncCheckpointSaver's Start and Finalize, one after the other. Preconditions: the
// params are synced (the param sync of buffers/bucket_sync.h, or DDP's, has completed), and
// `optimizer` steps `buffers` (e.g. optimizers/distributed's CreateDistributedOptimizer, in any
// mode). Every rank's collectives use comm.timeout(). `expert_comm`: the group the expert buffers
// are sharded over (see the file comment); null: `comm`. Errors: kAlreadyExists if the step
// is already committed; OS errors naming the path; kAborted "rank R failed to write its shard"
// on the ranks whose own write succeeded when another's failed; kInternal when two ranks wrote
// the same record or a tp-split param's slice is missing; kInvalidArgument for a `tp` split whose
// size or rank is not `tp`'s; those of the communicator. On any error `latest` is unchanged (the
// `.tmp` directory is left for the next save to remove). `tp`: see TensorParallelism.
absl::Status SaveDistributedCheckpoint(
    const std::string& root, const SharedState& shared,
    absl::Span<buffers::ParamAndGradBuffer* const> buffers,
    const optimizers::OptimizerState& optimizer,
    collectives::Communicator& comm, const SaveOptions& options = {},
    collectives::Communicator* expert_comm = nullptr, const TensorParallelism& tp = {});

// One rank's part of a save, in host memory: clones of what it writes and their records.
struct RankSnapshot {
  int rank = 0;
  int64_t step = 0;
  std::vector<at::Tensor> tensors;   // owns the bytes `records` point into
  std::vector<RecordData> records;
  std::vector<std::pair<std::string, std::string>> full_shapes;  // state name → "48,16"
};

// Clones rank comm.rank()'s params (those whose first element it owns, by its rank in each
// buffer's group: `expert_comm` for expert buffers when not null, else tp.dp_comm or `comm`) and
// optimizer state; with tensor parallelism only what its tp rank saves (see the file comment).
// Collective over a buffer's group when the buffer has sharded residency and a param that
// straddles shards (see "param" above); every rank must call it. Precondition: no param sync in
// flight. Errors: kInvalidArgument for a dtype safetensors cannot hold or a split that is not
// `tp`'s; kInternal (LibTorch); the communicator's.
absl::StatusOr<RankSnapshot> SnapshotRank(const SharedState& shared,
                                          absl::Span<buffers::ParamAndGradBuffer* const> buffers,
                                          const optimizers::OptimizerState& optimizer,
                                          collectives::Communicator& comm,
                                          collectives::Communicator* expert_comm = nullptr,
                                          const TensorParallelism& tp = {});

// Writes `snap` as rank<r>.safetensors plus its record list into the `.tmp` directory `tmp`
// (no collectives; safe on a background thread). Errors: those of WriteShard, OS errors.
absl::Status WriteRankSnapshot(const std::string& tmp, const RankSnapshot& snap);

// At most one save in flight. Usage per rank, on the training thread:
//   AsyncCheckpointSaver saver(&comm);
//   RETURN_IF_ERROR(saver.Start(root, shared, buffers, *opt));  // returns after the snapshot
//   ... training steps ...
//   RETURN_IF_ERROR(saver.Finalize());  // or the next Start, which finalizes first
// `comm` (the world), `expert_comm` (the expert buffers' group; null: `comm`), tp.dp_comm, the
// buffers and the optimizer must outlive the saver.
class AsyncCheckpointSaver {
 public:
  explicit AsyncCheckpointSaver(collectives::Communicator* comm,
                                collectives::Communicator* expert_comm = nullptr,
                                TensorParallelism tp = {})
      : comm_(comm), expert_comm_(expert_comm), tp_(std::move(tp)) {}
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;
  // Joins a running write; does NOT commit it (its `.tmp` directory is removed by a later save).
  ~AsyncCheckpointSaver();

  // Finalizes the save in flight first; if that failed, returns its error and starts nothing.
  // Then begins step `shared.step` (rank 0 creates its `.tmp` directory; every rank learns whether
  // it could), snapshots this rank's part (synchronously) and starts the background write. A
  // snapshot that fails counts as this rank's write failure: the save is in flight and Finalize
  // returns it (every rank learns of it there). Errors: the previous save's; kAborted / the
  // directory's error when the save could not begin; the communicator's.
  absl::Status Start(const std::string& root, const SharedState& shared,
                     absl::Span<buffers::ParamAndGradBuffer* const> buffers,
                     const optimizers::OptimizerState& optimizer,
                     const SaveOptions& options = {});

  // Waits for the write in flight, then barrier, rank 0 merge + commit, barrier. OK when nothing is
  // in flight. Errors: the write's (this rank's) or kAborted for another rank's; the commit's.
  // A failed save never moves `latest`.
  absl::Status Finalize();

  bool in_flight() const { return pending_; }

  // Whether this rank's background write has ended, so that Finalize would not wait for it; false
  // when nothing is in flight. Never blocks: a caller can agree with the other ranks (e.g. within a
  // collective it runs anyway) to finalize as soon as every rank's write is done.
  bool write_finished() const {
    return pending_ && write_finished_.load(std::memory_order_acquire);
  }

 private:
  collectives::Communicator* comm_;
  collectives::Communicator* expert_comm_;
  TensorParallelism tp_;
  bool pending_ = false;  // started and not finalized (the write may have ended)
  std::thread thread_;
  std::atomic<bool> write_finished_{false};
  absl::Status write_status_;
  std::string root_;
  SharedState shared_;
  std::vector<buffers::ParamAndGradBuffer*> buffers_;
  SaveOptions options_;
  RankSnapshot snapshot_;
};

// Loads the checkpoint at `path` (a step directory, or a root whose `latest` is followed) into
// `buffers` (this rank's shards, then the param sync: dense buffers over tp.dp_comm or `comm`,
// expert buffers over `expert_comm`, null meaning `comm`) and `optimizer`, at comm.size() ranks,
// any layout, any expert and any tensor parallelism (`tp`: this run's). Errors (nothing live is
// changed on any of them): those of CheckpointReader::Open (kDataLoss naming a param whose tp
// slice is missing)
// (kNotFound, kDataLoss naming the file and tensor for a missing, truncated or corrupted shard,
// kFailedPrecondition for an unknown format version); kNotFound "checkpoint <dir>: no record
// '<name>' (param)" for a param of the model that was not saved; kFailedPrecondition for a dtype or
// shape mismatch (naming file and tensor), and "checkpoint <dir>: param '<name>' is [8,4] whole,
// the model's is [8,6] (local [8,3], dim 1, ...)" when the model's whole shape differs;
// kNotFound naming a state tensor whose saved tp slices leave out elements this rank needs;
// kDataLoss for bad shared-state metadata; kAborted "another rank failed to load" on ranks whose
// own reads succeeded; kInvalidArgument for a split that is not `tp`'s. After a successful read,
// ImportState errors (kNotFound, kInvalidArgument) are returned as such.
absl::StatusOr<SharedState> LoadDistributedCheckpoint(
    const std::string& path, absl::Span<buffers::ParamAndGradBuffer* const> buffers,
    optimizers::OptimizerState& optimizer,
    collectives::Communicator& comm, collectives::Communicator* expert_comm = nullptr,
    const TensorParallelism& tp = {});

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_DISTRIBUTED_CHECKPOINT_H_
