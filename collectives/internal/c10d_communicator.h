// The Communicator over any c10d::Backend (ProcessGroupGloo, ProcessGroupNCCL): launch validation,
// collective sequence numbers, progress published to the store, traffic counters, Work handles that
// turn engine failures into statuses naming the collective and the missing ranks, and the finishing
// steps of emulated operations. The backend files (gloo_communicator.cc, nccl_communicator.cc) only
// say how to connect the engine and what it supports natively (Engine, EngineTraits); every
// communicator, world or subgroup (internal/subgroup.h), is created by ConnectC10dCommunicator.
#ifndef ORTHOSHARD_COLLECTIVES_INTERNAL_C10D_COMMUNICATOR_H_
#define ORTHOSHARD_COLLECTIVES_INTERNAL_C10D_COMMUNICATOR_H_

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"

namespace orthoshard::collectives::internal_collectives {

// What the engine behind a c10d::Backend needs and supports.
struct EngineTraits {
  std::string name = "gloo";           // backend_name() and the prefix of error messages
  at::Device device{at::kCPU};         // every tensor must be on it
  bool native_avg = false;             // else SUM, then a division by size in Wait
  bool native_reduce_scatter = false;  // else an all-reduce of the input, then the own shard
  // Reduce-scatter and all-gather as rings over the engine's send/recv (internal/ring.h) instead of
  // its all-reduce and all-gather: the ideal wire bytes where the engine has no reduce-scatter.
  bool ring_collectives = false;
  // c10d's Work::wait(timeout) may be called again after it timed out (Gloo's collectives and the
  // ring's Works: c10d's base Work). Then Wait waits in slices of kPeerFailurePoll and gives up
  // early once a peer gave up on the collective (communicator.h). NCCL's wait with a timeout marks
  // the work timed out, so it is called once, with the whole timeout.
  bool resumable_wait = false;
};

// How a communicator names its ranks in messages. A world communicator (empty `global_ranks`) says
// "rank 3"; a subgroup says "rank 1 (global 3)": its own rank, then the world rank it is, and
// prefixes every message with `label` ("tp group 1 [2, 3]: ...").
struct GroupNaming {
  std::string label;              // empty for a world communicator
  std::vector<int> global_ranks;  // [group rank] -> world rank; empty for a world communicator
};

// "rank 1", "rank 1 (detail)", "rank 1 (global 3)" or "rank 1 (global 3, detail)".
std::string NameRank(const GroupNaming& naming, int rank, const std::string& detail = "");

// The engine-specific half of creating a communicator (gloo_communicator.cc, nccl_communicator.cc):
// connects rank `rank` of `size` over `store`, blocking until every rank of the group arrived
// (bounded by the engine's rendezvous timeout), and returns the backend with its collective timeout
// set. Errors: kDeadlineExceeded or kUnavailable with the engine's message, kInternal.
using ConnectBackendFn = std::function<absl::StatusOr<c10::intrusive_ptr<c10d::Backend>>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)>;

// An engine as a communicator was created on it. Every communicator keeps its own, so that its
// subgroups are created by the same code with the same options (internal/subgroup.h).
struct Engine {
  EngineTraits traits;
  absl::Duration timeout = absl::Seconds(60);  // inside the engine, on every collective
  ConnectBackendFn connect;
};

// The one path by which communicators are created, world and subgroups alike: engine.connect on
// `store`, then the wrapper. `store` is the (prefixed) store of this group; progress is published
// there. Work::Wait always passes a timeout to c10d's Work::wait, which for NCCL is what makes the
// host block until the kernels completed. Errors: engine.connect's.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectC10dCommunicator(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, Engine engine,
    GroupNaming naming = {});

// What a communicator of this file was created with, for creating its subgroups the same way.
struct C10dOrigin {
  c10::intrusive_ptr<c10d::Store> store;  // the group's own (prefixed) store
  Engine engine;
  GroupNaming naming;
  int64_t namespaces_handed_out = 0;  // by NextSubgroupNamespace (internal/subgroup.h)
};

// `comm`'s origin if ConnectC10dCommunicator created it, else nullptr.
C10dOrigin* OriginOf(Communicator& comm);

// The exception's message, without the C++ backtrace of a c10::Error.
std::string WhatOf(const std::exception& e);

// `d` in milliseconds, at least one.
std::chrono::milliseconds ToChrono(absl::Duration d);

// Ignores SIGPIPE if it still has the default disposition, as Python (and so torch.distributed)
// does: a write to a dead peer's socket must be an error status, not the death of this rank.
void IgnoreSigpipe();

// The option checks every engine shares. Errors: kInvalidArgument prefixed with `engine` ("gloo: rank
// 3 must be in [0, size) with size 2 >= 1"; "...: timeouts must be positive, ...").
absl::Status CheckRankAndTimeouts(const char* engine, int rank, int size, absl::Duration timeout,
                                  absl::Duration rendezvous_timeout);

}  // namespace orthoshard::collectives::internal_collectives

#endif  // ORTHOSHARD_COLLECTIVES_INTERNAL_C10D_COMMUNICATOR_H_
