#include "collectives/gloo_communicator.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/internal/c10d_communicator.h"
#include "collectives/internal/gloo_backend.h"
#include "common/status_macros.h"

namespace orthoshard::collectives {
namespace {

using internal_collectives::IgnoreSigpipe;
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

}  // namespace

GlooOptions GlooOptionsFromRendezvous(const RendezvousInfo& info) {
  GlooOptions options;
  options.rank = info.rank;
  options.size = info.world_size;
  options.master_addr = info.master_addr;
  options.master_port = info.master_port;
  options.host_store = info.HostsStore();
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
                   internal_collectives::ConnectTcpStore(
                       absl::StrCat("gloo: rank ", options.rank), options.master_addr,
                       options.master_port, options.host_store, options.rendezvous_timeout));
  return CreateGlooCommunicator(std::move(store), options);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const GlooOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  IgnoreSigpipe();
  c10::intrusive_ptr<c10d::Store> prefixed =
      c10::make_intrusive<c10d::PrefixStore>("orthoshard", std::move(store));
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Backend> backend,
                   internal_collectives::CreateGlooBackend(prefixed, options.rank, options.size,
                                                           ToChrono(options.rendezvous_timeout),
                                                           options.hostname, options.threads));
  try {
    // A virtual call into libtorch's ProcessGroupGloo; from now on collectives use `timeout`.
    backend->setTimeout(ToChrono(options.timeout));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("gloo: setting the timeout failed: ", WhatOf(e)));
  }
  internal_collectives::EngineTraits traits;
  traits.name = "gloo";
  traits.device = at::Device(at::kCPU);
  traits.native_avg = false;             // ProcessGroupGloo rejects ReduceOp::AVG
  traits.native_reduce_scatter = false;  // its tensor-form reduce-scatter is an all-reduce anyway
  return internal_collectives::MakeC10dCommunicator(prefixed, std::move(backend), options.rank,
                                                    options.size, options.timeout,
                                                    std::move(traits));
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
