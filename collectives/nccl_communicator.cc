#include "collectives/nccl_communicator.h"

#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/internal/c10d_communicator.h"
#include "collectives/internal/job_store.h"
#include "common/status_macros.h"

namespace orthoshard::collectives {
namespace {

using internal_collectives::IgnoreSigpipe;
using internal_collectives::RendezvousOf;
using internal_collectives::ToChrono;
using internal_collectives::WhatOf;

absl::Status CheckOptions(const NcclOptions& options) {
  RETURN_IF_ERROR(internal_collectives::CheckRankAndTimeouts(
      "nccl", options.rank, options.size, options.timeout, options.rendezvous_timeout));
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: device must be non-negative, got ", options.device));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectRanks(c10::intrusive_ptr<c10d::Store> prefixed,
                                                          const NcclOptions& options);

}  // namespace

NcclOptions NcclOptionsFromRendezvous(const RendezvousInfo& info) {
  NcclOptions options;
  options.rank = info.rank;
  options.size = info.world_size;
  options.device = info.local_rank;
  options.master_addr = info.master_addr;
  options.master_port = info.master_port;
  options.host_store = info.HostsStore();
  options.job_id = info.job_id;
  options.attempt = info.attempt;
  options.job_token = info.job_token;
  return options;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (options.master_port < 0 || options.master_port > 65535 ||
      (options.master_port == 0 && !options.host_store)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: master_port ", options.master_port, " is not a usable port"));
  }
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store,
                   internal_collectives::ConnectJobStore(RendezvousOf("nccl", options)));
  return ConnectRanks(std::move(store), options);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const NcclOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  const internal_collectives::StoreRendezvous where = RendezvousOf("nccl", options);
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> job_store,
                   internal_collectives::JoinJobStore(
                       std::move(store), where.job, absl::StrCat("nccl: rank ", options.rank),
                       "the given store", options.rendezvous_timeout));
  return ConnectRanks(std::move(job_store), options);
}

namespace {

// How NCCL is connected on `device` with `options`' timeouts, over any store and any group: the
// world's and, through the communicator's Engine, its subgroups' (each a ProcessGroupNCCL of its
// own, its NCCL unique id exchanged on the group's store among its members only).
internal_collectives::Engine NcclEngine(const NcclOptions& options, const at::Device& device) {
  internal_collectives::Engine engine;
  engine.traits.name = "nccl";
  engine.traits.device = device;
  engine.traits.native_avg = true;             // ncclAvg
  engine.traits.native_reduce_scatter = true;  // ncclReduceScatter through _reduce_scatter_base
  engine.timeout = options.timeout;
  const std::chrono::milliseconds rendezvous_timeout = ToChrono(options.rendezvous_timeout);
  const std::chrono::milliseconds timeout = ToChrono(options.timeout);
  engine.connect = [=](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      -> absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> {
    try {
      c10::cuda::set_device(device.index());
      // Creating the NCCL communicator waits on the store for rank 0's unique id.
      store->setTimeout(rendezvous_timeout);
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      c10::intrusive_ptr<c10d::Backend> backend =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
      // As init_process_group(device_id=...): bind the device and create the communicator now, so
      // a missing rank fails here rather than in the first collective.
      backend->setBoundDeviceId(device);
      backend->eagerConnectSingleDevice(device);
      return backend;
    } catch (const std::exception& e) {
      const std::string what = WhatOf(e);
      const std::string message = absl::StrCat("nccl rendezvous of rank ", rank, " of ", size,
                                               " on ", device.str(), " failed: ", what);
      if (absl::StrContains(what, "imeout") || absl::StrContains(what, "imed out")) {
        return absl::DeadlineExceededError(message);
      }
      return absl::UnavailableError(message);
    }
  };
  return engine;
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectRanks(c10::intrusive_ptr<c10d::Store> prefixed,
                                                          const NcclOptions& options) {
  IgnoreSigpipe();
  const int devices = c10::cuda::device_count();
  if (options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("nccl: rank ", options.rank,
                                                      " needs CUDA device ", options.device,
                                                      ", this machine has ", devices));
  }
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.device));
  return internal_collectives::ConnectC10dCommunicator(std::move(prefixed), options.rank,
                                                       options.size, NcclEngine(options, device));
}

}  // namespace

}  // namespace orthoshard::collectives
