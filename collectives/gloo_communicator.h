// The CPU Communicator: c10d's ProcessGroupGloo over a c10d TCPStore.
//
// All-reduce and broadcast run on Gloo's worker threads; Work::Wait blocks on c10d's Work. Gloo has
// no real tensor reduce-scatter (c10d's is an all-reduce of the whole input) and no AVG, so
// reduce-scatter and all-gather run as rings over Gloo's send/recv on a thread of the communicator
// (internal/ring.h: (N - 1)/N of the buffer sent per rank, the ideal; uneven shards natively; the
// wire counters count what was sent), and AVG is SUM followed by a division by the number of
// ranks. Tensors must be on the CPU. Each launch also
// publishes its collective sequence number to the store (one TCPStore round trip) so that, when a
// collective fails or times out, the survivors can name the ranks that had not launched it.
#ifndef ORTHOSHARD_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define ORTHOSHARD_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/rendezvous.h"

namespace orthoshard::collectives {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string master_addr = "127.0.0.1";  // host of the TCPStore
  int master_port = 29500;                // its port
  bool host_store = false;                // this process runs the TCPStore server
  std::string hostname = "127.0.0.1";     // address Gloo binds to and advertises to peers
  // Bound on the rendezvous and, inside Gloo, on every collective: a peer that does not take part
  // within it makes the collective fail on every rank.
  absl::Duration timeout = absl::Seconds(60);
  // Bound on connecting to the store and to every peer at creation: ranks of one job start at
  // different times (loading LibTorch takes seconds on a busy machine).
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  int threads = 2;  // Gloo worker threads
  // The job and attempt this rank belongs to (RendezvousInfo::job_id, attempt): the store must be
  // this job's, and the rendezvous keys live under the attempt's own prefix.
  std::string job_id;
  int attempt = 0;
  // The job's token (RendezvousInfo::job_token), which must match the store's.
  std::string job_token;
};

// Options for this process from the rendezvous environment.
GlooOptions GlooOptionsFromRendezvous(const RendezvousInfo& info);

// Both overloads set SIGPIPE to SIG_IGN if it has the default disposition (as Python does), so a
// dead peer is an error status rather than the death of this process.
//
// Connects to (or, with host_store, starts) the TCPStore and connects every rank with Gloo.
// Blocks until all `size` ranks arrived, at most about 2 x rendezvous_timeout (the store, then the
// peers), also when something at the store's address accepts connections but never answers.
// Errors: kInvalidArgument for rank/size/timeout out of range; kDeadlineExceeded or kUnavailable,
// naming the store address and the likely cause, when the store or a peer cannot be reached in
// time; kFailedPrecondition when the store belongs to another job or another process of this job
// holds this rank ("... rank 1 was probably started twice ...": see JoinJobStore).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options);

// As above over an existing store (e.g. one hosted by a launcher or a test); `options`'
// master_addr, master_port and host_store are ignored (the address in messages is "the given
// store").
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const GlooOptions& options);

// Joins the job this process's environment describes (torchrun's or SLURM's variables, as
// LaunchLocal sets them) as a Gloo rank: ParseRendezvous, GlooOptionsFromRendezvous with the two
// timeouts, CreateGlooCommunicator. Errors: those three's (kNotFound outside a launcher).
absl::StatusOr<std::unique_ptr<Communicator>> JoinGlooFromEnvironment(
    absl::Duration timeout, absl::Duration rendezvous_timeout);

}  // namespace orthoshard::collectives

#endif  // ORTHOSHARD_COLLECTIVES_GLOO_COMMUNICATOR_H_
