// The job's store: connecting to (or hosting) the TCPStore under a deadline, checking that it
// belongs to this job and claiming this rank in it, before an engine rendezvouses on it. Used by
// every engine's Create function (gloo_communicator.cc, nccl_communicator.cc) and by the multi-rank
// test harness.
#ifndef ORTHOSHARD_COLLECTIVES_INTERNAL_JOB_STORE_H_
#define ORTHOSHARD_COLLECTIVES_INTERNAL_JOB_STORE_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace orthoshard::collectives::internal_collectives {

// Starts a TCPStore server listening on `addr` only (resolved; the first of its addresses that
// binds), on `port` (0: a free one, see getPort()), not on every interface as c10d binds by itself:
// the socket is bound here and handed to c10d (TCPStoreOptions::masterListenFd). A loopback `addr`
// (127.0.0.1, localhost) is thus reachable from this machine only; a routable one from every host
// that can route to it, with no authentication on the wire (see JobIdentity::token).
// Errors: kUnavailable starting with `what`, naming addr:port and why ("cannot bind ...: Cannot
// assign requested address" for an address that is not this machine's).
absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> HostTcpStore(const std::string& what,
                                                                const std::string& addr, int port,
                                                                absl::Duration timeout);

// The key under which a hosted store records its job token (HostTcpStore's caller sets it before
// any rank may join), outside every attempt's prefix.
inline constexpr char kJobTokenKey[] = "orthoshard/token";

// Connects to (or, with host_store, starts with HostTcpStore) a TCPStore within `timeout`. Errors:
// kUnavailable starting with `what` (e.g. "gloo: rank 1"), naming the address and c10d's message.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectTcpStore(const std::string& what,
                                                                const std::string& addr, int port,
                                                                bool host_store,
                                                                absl::Duration timeout);

// What a rank joins: its job and attempt (RendezvousInfo), for JoinJobStore.
struct JobIdentity {
  std::string job_id;  // may be empty: then only the world size is checked
  int attempt = 0;
  int world_size = 1;
  // The rank this process joins as, claimed in the store by one process only; -1 (a process that
  // only uses the store) claims none.
  int rank = -1;
  // The job's secret (ORTHOSHARD_JOB_TOKEN; LaunchLocal makes one per launch), checked against the
  // one the store holds under kJobTokenKey: a rank with another or none is refused. Empty: the
  // store must hold none. It keeps foreign and stray ranks out of a job; it is sent in clear text,
  // and c10d's store answers any client, so it is no protection against whoever can reach the
  // store's address or read the traffic.
  std::string token;
};

// The store the engine rendezvouses on: `store` under the prefix "orthoshard/attempt<N>" (an
// elastic restart never reads the keys of the attempt before it), after checking that the store
// belongs to this job: the first rank to arrive records "job <id>, world size <n>", every rank
// compares (one compareSet). Then job.rank, if any, is claimed for this process ("host H pid P"),
// so that a second process with the same rank in the same attempt fails at once instead of
// breaking the engine's rendezvous (measured: 71 s, then an error blaming rank 0); the same
// process may join again. Errors: kFailedPrecondition starting with `what` when the store holds
// another job's identity ("... the TCPStore at ADDR belongs to another job (it holds 'job a,
// world size 4'; this rank is 'job b, world size 2'): MASTER_PORT is probably taken by another
// job") or when another process holds the rank ("... rank 1 of job a is already taken by host H
// pid P (this is host H pid Q): rank 1 was probably started twice ..."); kPermissionDenied
// starting with `what` when job.token differs from the store's ("... the job token
// (ORTHOSHARD_JOB_TOKEN) does not match the one the TCPStore at ADDR was started with ..."), checked
// first; kUnavailable when the store cannot be used.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> JoinJobStore(c10::intrusive_ptr<c10d::Store> store,
                                                            const JobIdentity& job,
                                                            const std::string& what,
                                                            const std::string& address,
                                                            absl::Duration timeout);

// Where an engine's ranks meet: the store's address (and whether this rank hosts it), who this rank
// is, and the job it belongs to.
struct StoreRendezvous {
  const char* engine = "gloo";  // prefixes messages: "gloo: rank 1: ..."
  int rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool host_store = false;
  absl::Duration timeout = absl::Seconds(60);
  JobIdentity job;
};

// The rendezvous of a rank created with `options` (GlooOptions or NcclOptions, which share these
// fields) of engine `engine`.
template <typename EngineOptions>
StoreRendezvous RendezvousOf(const char* engine, const EngineOptions& options) {
  StoreRendezvous where;
  where.engine = engine;
  where.rank = options.rank;
  where.master_addr = options.master_addr;
  where.master_port = options.master_port;
  where.host_store = options.host_store;
  where.timeout = options.rendezvous_timeout;
  where.job.job_id = options.job_id;
  where.job.attempt = options.attempt;
  where.job.world_size = options.size;
  where.job.rank = options.rank;
  where.job.token = options.job_token;
  return where;
}

// Connects to (or hosts) the TCPStore and joins the job's part of it (JoinJobStore), the whole
// under RunWithDeadline(timeout + 5 s): the store's own errors come first when it answers at all.
// Errors: as ConnectTcpStore and JoinJobStore; kDeadlineExceeded "gloo: rank 1: no answer from the
// TCPStore at A:P within 6s: something that is not this job's store ... check MASTER_ADDR and
// MASTER_PORT".
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectJobStore(const StoreRendezvous& where);

// Runs `fn` on a thread of its own and waits at most `deadline` for it. c10d's TCPStore client
// blocks without bound when whatever listens at the address accepts the connection but never
// answers (measured: over 100 s with a 5 s store timeout), so a rendezvous cannot rely on the
// engine's timeouts alone. On expiry the thread is detached (whatever it returns later is dropped)
// and the result is kDeadlineExceeded with `on_timeout`.
// (std::mutex rather than absl::Mutex: Debian's abseil is a shared library ThreadSanitizer does
// not instrument, so its Mutex would hide this hand-over from --config=tsan.)
template <typename T>
absl::StatusOr<T> RunWithDeadline(absl::Duration deadline, std::string on_timeout,
                                  std::function<absl::StatusOr<T>()> fn) {
  struct Result {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;                                             // guarded by mu
    absl::StatusOr<T> value = absl::UnknownError("not run");       // guarded by mu
  };
  auto result = std::make_shared<Result>();
  std::thread([result, fn = std::move(fn)] {
    absl::StatusOr<T> value = fn();
    std::lock_guard<std::mutex> lock(result->mu);
    result->value = std::move(value);
    result->done = true;
    result->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(result->mu);
  if (!result->cv.wait_for(lock, absl::ToChronoNanoseconds(deadline),
                           [&result] { return result->done; })) {
    return absl::DeadlineExceededError(std::move(on_timeout));
  }
  return std::move(result->value);
}

}  // namespace orthoshard::collectives::internal_collectives

#endif  // ORTHOSHARD_COLLECTIVES_INTERNAL_JOB_STORE_H_
