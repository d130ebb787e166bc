#include "collectives/internal/job_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/internal/c10d_communicator.h"
#include "common/status_macros.h"

namespace orthoshard::collectives::internal_collectives {
namespace {

// "host H pid P": who this process is, for the rank claim.
std::string ThisProcess() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat("host ", host[0] != '\0' ? host : "(unknown)", " pid ", getpid());
}

// Records this process as the holder of `job.rank` in the (prefixed) store, or fails naming the
// process that holds it.
absl::Status ClaimRank(c10d::Store& store, const JobIdentity& job, const std::string& what,
                       const std::string& address) {
  const std::string mine = ThisProcess();
  std::string holder;
  try {
    const std::vector<uint8_t> held = store.compareSet(
        absl::StrCat("rank/", job.rank), {}, std::vector<uint8_t>(mine.begin(), mine.end()));
    holder.assign(held.begin(), held.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the TCPStore at ", address, " cannot be used: ", WhatOf(e)));
  }
  if (holder == mine) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": rank ", job.rank, " of job ", job.job_id.empty() ? "(unnamed)" : job.job_id,
      " is already taken by ", holder, " (this is ", mine, "): rank ", job.rank,
      " was probably started twice (two processes with the same RANK or SLURM_PROCID in one "
      "job); check how the ranks are numbered"));
}

// Checks this rank's job token against the store's: the first to ask records it (a hosted store's
// host does so before any rank starts: LaunchLocal; rank 0, which hosts, before any other rank
// can have joined).
absl::Status CheckToken(c10d::Store& store, const JobIdentity& job, const std::string& what,
                        const std::string& address) {
  const std::string mine = absl::StrCat("token:", job.token);  // never empty, so compareSet works
  std::string held;
  try {
    const std::vector<uint8_t> value = store.compareSet(
        kJobTokenKey, {}, std::vector<uint8_t>(mine.begin(), mine.end()));
    held.assign(value.begin(), value.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the TCPStore at ", address, " cannot be used: ", WhatOf(e)));
  }
  if (held == mine) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": the job token (ORTHOSHARD_JOB_TOKEN) ",
      job.token.empty() ? "is not set, but the TCPStore at " : "does not match the one the TCPStore at ",
      address, job.token.empty() ? " was started with one" : " was started with",
      ": this process is not a rank of the job that store belongs to, or was started without the "
      "job's ORTHOSHARD_JOB_TOKEN"));
}

// A listening TCP socket on `addr`:`port` (the first resolved address that binds).
absl::StatusOr<int> Listen(const std::string& what, const std::string& addr, int port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot host the TCPStore at ", addr, ":",
                                               port, ": cannot resolve ", addr, ": ",
                                               gai_strerror(rc)));
  }
  std::string why = "no address";
  int fd = -1;
  for (const addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = absl::StrCat("socket: ", strerror(errno));
      continue;
    }
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      why = absl::StrCat("cannot bind or listen: ", strerror(errno));
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot host the TCPStore at ", addr, ":",
                                               port, ": ", why,
                                               " (MASTER_ADDR must be an address of this host)"));
  }
  return fd;
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> HostTcpStore(const std::string& what,
                                                                const std::string& addr, int port,
                                                                absl::Duration timeout) {
  ASSIGN_OR_RETURN(const int fd, Listen(what, addr, port));
  try {
    sockaddr_storage bound = {};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const uint16_t bound_port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    c10d::TCPStoreOptions store_options;
    store_options.port = bound_port;
    store_options.isServer = true;
    store_options.waitWorkers = false;
    store_options.timeout = ToChrono(timeout);
    store_options.masterListenFd = fd;  // c10d owns it from here
    return c10::make_intrusive<c10d::TCPStore>(addr, store_options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot host the TCPStore at ", addr, ":",
                                               port, ": ", WhatOf(e)));
  }
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> JoinJobStore(c10::intrusive_ptr<c10d::Store> store,
                                                            const JobIdentity& job,
                                                            const std::string& what,
                                                            const std::string& address,
                                                            absl::Duration timeout) {
  try {
    store->setTimeout(ToChrono(timeout));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the TCPStore at ", address, " cannot be used: ", WhatOf(e)));
  }
  RETURN_IF_ERROR(CheckToken(*store, job, what, address));
  c10::intrusive_ptr<c10d::Store> prefixed = c10::make_intrusive<c10d::PrefixStore>(
      absl::StrCat("orthoshard/attempt", job.attempt), std::move(store));
  const std::string mine = absl::StrCat("job ", job.job_id.empty() ? "(unnamed)" : job.job_id,
                                        ", world size ", job.world_size);
  std::string theirs;
  try {
    prefixed->setTimeout(ToChrono(timeout));
    const std::vector<uint8_t> held =
        prefixed->compareSet("job", {}, std::vector<uint8_t>(mine.begin(), mine.end()));
    theirs.assign(held.begin(), held.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the TCPStore at ", address, " cannot be used: ", WhatOf(e)));
  }
  if (theirs != mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the TCPStore at ", address, " belongs to another job (it holds '", theirs,
        "'; this rank is '", mine, "'): MASTER_PORT is probably taken by another job, or the "
        "ranks were started with different WORLD_SIZE"));
  }
  if (job.rank >= 0) RETURN_IF_ERROR(ClaimRank(*prefixed, job, what, address));
  return prefixed;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectJobStore(const StoreRendezvous& where) {
  const std::string what = absl::StrCat(where.engine, ": rank ", where.rank);
  const std::string address = absl::StrCat(where.master_addr, ":", where.master_port);
  const absl::Duration deadline = where.timeout + absl::Seconds(5);
  return RunWithDeadline<c10::intrusive_ptr<c10d::Store>>(
      deadline,
      absl::StrCat(what, ": no answer from the TCPStore at ", address, " within ",
                   absl::FormatDuration(deadline),
                   ": something that is not this job's store (another program, or a stalled "
                   "process) may be listening there; check MASTER_ADDR and MASTER_PORT"),
      [what, address, where]() -> absl::StatusOr<c10::intrusive_ptr<c10d::Store>> {
        ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store,
                         ConnectTcpStore(what, where.master_addr, where.master_port,
                                         where.host_store, where.timeout));
        return JoinJobStore(std::move(store), where.job, what, address, where.timeout);
      });
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectTcpStore(const std::string& what,
                                                                const std::string& addr, int port,
                                                                bool host_store,
                                                                absl::Duration timeout) {
  if (host_store) {
    ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::TCPStore> hosted,
                     HostTcpStore(what, addr, port, timeout));
    return c10::intrusive_ptr<c10d::Store>(std::move(hosted));
  }
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(port);
    store_options.isServer = false;
    store_options.waitWorkers = false;
    store_options.timeout = ToChrono(timeout);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(addr, store_options);
    return store;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, " cannot reach the TCPStore at ", addr, ":",
                                               port, ": ", WhatOf(e)));
  }
}

}  // namespace orthoshard::collectives::internal_collectives
