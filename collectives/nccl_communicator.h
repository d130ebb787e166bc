// The GPU Communicator: c10d's ProcessGroupNCCL over a c10d TCPStore, for CUDA tensors on this
// process's GPU (LOCAL_RANK). Built only under --config=cuda: otherwise //collectives:nccl is an
// empty library (this header still compiles; callers guard their calls with `#ifdef
// ORTHOSHARD_CUDA`).
//
// NCCL runs SUM, AVG (ncclAvg), tensor-form reduce-scatter (_reduce_scatter_base) and all-gather
// natively: nothing is emulated, so the logical byte counters match what the engine reduces. Uneven
// shards are padded to the largest shard in staging buffers on the GPU. Launches are stream-ordered
// after the work already queued on the current CUDA stream. Work::Wait always gives c10d's
// WorkNCCL::wait a timeout: without one it would only make the current stream wait for NCCL's
// stream and return at once; with one it blocks the host until the collective completed (and then
// orders the current stream after it too), so a returned OK means the results are in place. As with
// Gloo, every launch publishes its collective sequence number to the store, so that a failure names
// the ranks that had not launched it.
#ifndef ORTHOSHARD_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define ORTHOSHARD_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/rendezvous.h"

namespace orthoshard::collectives {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  int device = 0;                         // CUDA device of this rank (LOCAL_RANK)
  std::string master_addr = "127.0.0.1";  // host of the TCPStore
  int master_port = 29500;                // its port
  bool host_store = false;                // this process runs the TCPStore server
  // Bound on every collective (c10d's watchdog fails a collective that runs longer) and the
  // timeout of waits in the conformance suite.
  absl::Duration timeout = absl::Seconds(60);
  // Bound on connecting to the store and on creating the NCCL communicator.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // The job and attempt this rank belongs to (as GlooOptions).
  std::string job_id;
  int attempt = 0;
  std::string job_token;  // as GlooOptions
};

// Options for this process from the rendezvous environment; `device` is the local rank.
NcclOptions NcclOptionsFromRendezvous(const RendezvousInfo& info);

// Both overloads set SIGPIPE to SIG_IGN if it has the default disposition, make `device` the
// current CUDA device and create the NCCL communicator eagerly (blocks until all `size` ranks
// arrived). Errors: kInvalidArgument for rank/size/device/timeout/port out of range;
// kFailedPrecondition when `device` is not a CUDA device of this machine (naming the device count);
// kDeadlineExceeded or kUnavailable, naming the store address or NCCL's message, when the
// rendezvous fails (bounded as for Gloo); kFailedPrecondition when the store belongs to another
// job or another process of this job holds this rank (as for Gloo).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options);

// As above over an existing store; `options`' master_addr, master_port and host_store are ignored.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const NcclOptions& options);

}  // namespace orthoshard::collectives

#endif  // ORTHOSHARD_COLLECTIVES_NCCL_COMMUNICATOR_H_
