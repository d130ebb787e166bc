#include "collectives/gloo_communicator.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/internal/c10d_communicator.h"
#include "collectives/internal/job_store.h"
#include "collectives/internal/gloo_backend.h"
#include "common/status_macros.h"

namespace orthoshard::collectives {
namespace {

using internal_collectives::IgnoreSigpipe;
using internal_collectives::RendezvousOf;
using internal_collectives::ToChrono;
using internal_collectives::WhatOf;

absl::Status CheckOptions(const GlooOptions& options) {
  RETURN_IF_ERROR(internal_collectives::CheckRankAndTimeouts(
      "gloo", options.rank, options.size, options.timeout, options.rendezvous_timeout));
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: threads must be at least 1, got ", options.threads));
  }
  return absl::OkStatus();
}

// How Gloo is connected with `options` (threads, hostname, timeouts), over any store and any
// group: the world's and, through the communicator's Engine, its subgroups'.
internal_collectives::Engine GlooEngine(const GlooOptions& options) {
  internal_collectives::Engine engine;
  engine.traits.name = "gloo";
  engine.traits.device = at::Device(at::kCPU);
  engine.traits.native_avg = false;             // ProcessGroupGloo rejects ReduceOp::AVG
  engine.traits.native_reduce_scatter = false;  // its tensor-form reduce-scatter is an all-reduce
  // So reduce-scatter and all-gather run as rings over its send/recv: (N - 1)/N of the buffer on
  // the wire per rank instead of an all-reduce's 2 (N - 1)/N.
  engine.traits.ring_collectives = true;
  engine.traits.resumable_wait = true;
  engine.timeout = options.timeout;
  const std::chrono::milliseconds rendezvous_timeout = ToChrono(options.rendezvous_timeout);
  const std::chrono::milliseconds timeout = ToChrono(options.timeout);
  const std::string hostname = options.hostname;
  const int threads = options.threads;
  engine.connect = [=](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      -> absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> {
    ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Backend> backend,
                     internal_collectives::CreateGlooBackend(store, rank, size, rendezvous_timeout,
                                                             hostname, threads));
    try {
      // A virtual call into libtorch's ProcessGroupGloo; from now on collectives use `timeout`.
      backend->setTimeout(timeout);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("gloo: setting the timeout failed: ", WhatOf(e)));
    }
    return backend;
  };
  return engine;
}

// Connects every rank with Gloo over the job's store and wraps the backend.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectRanks(c10::intrusive_ptr<c10d::Store> store,
                                                          const GlooOptions& options) {
  IgnoreSigpipe();
  return internal_collectives::ConnectC10dCommunicator(std::move(store), options.rank,
                                                       options.size, GlooEngine(options));
}

}  // namespace

GlooOptions GlooOptionsFromRendezvous(const RendezvousInfo& info) {
  GlooOptions options;
  options.rank = info.rank;
  options.size = info.world_size;
  options.master_addr = info.master_addr;
  options.master_port = info.master_port;
  options.host_store = info.HostsStore();
  options.job_id = info.job_id;
  options.attempt = info.attempt;
  options.job_token = info.job_token;
  if (info.world_size != info.local_world_size) {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0) options.hostname = name;
  }
  return options;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (options.master_port < 0 || options.master_port > 65535 ||
      (options.master_port == 0 && !options.host_store)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: master_port ", options.master_port, " is not a usable port"));
  }
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store,
                   internal_collectives::ConnectJobStore(RendezvousOf("gloo", options)));
  return ConnectRanks(std::move(store), options);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const GlooOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  const internal_collectives::StoreRendezvous where = RendezvousOf("gloo", options);
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> job_store,
                   internal_collectives::JoinJobStore(
                       std::move(store), where.job, absl::StrCat("gloo: rank ", options.rank),
                       "the given store", options.rendezvous_timeout));
  return ConnectRanks(std::move(job_store), options);
}

absl::StatusOr<std::unique_ptr<Communicator>> JoinGlooFromEnvironment(
    absl::Duration timeout, absl::Duration rendezvous_timeout) {
  ASSIGN_OR_RETURN(const RendezvousInfo info, ParseRendezvous(ProcessEnvironment()));
  GlooOptions options = GlooOptionsFromRendezvous(info);
  options.timeout = timeout;
  options.rendezvous_timeout = rendezvous_timeout;
  return CreateGlooCommunicator(options);
}

}  // namespace orthoshard::collectives
