// In-process checks of the Gloo communicator: creation errors and launch validation at one rank.
// Multi-rank behaviour is in gloo_conformance_test (real processes).
#include "collectives/gloo_communicator.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

GlooOptions SingleRank() {
  GlooOptions options;
  options.rank = 0;
  options.size = 1;
  options.master_port = 0;  // the hosted store picks a free port
  options.host_store = true;
  options.timeout = absl::Seconds(10);
  return options;
}

// A TCPStore server on a free loopback port, for ranks that join it by the store itself.
c10::intrusive_ptr<c10d::TCPStore> ServerStore() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// An IPv4 address of this machine that is not loopback (getifaddrs), or 0 when it has none.
in_addr_t NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return 0;
  in_addr_t found = 0;
  for (const ifaddrs* a = list; a != nullptr && found == 0; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
    found = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
  }
  freeifaddrs(list);
  return found;
}

// 0 when a TCP connection to `addr` (network order) at `port` succeeds, else its errno.
int ConnectErrno(in_addr_t addr, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to = {};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = addr;
  to.sin_port = htons(static_cast<uint16_t>(port));
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

// A port that was free a moment ago on loopback.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Rank 0 hosting the store binds MASTER_ADDR only: with MASTER_ADDR=127.0.0.1 (a local job) a
// client through this machine's external address is refused; one on loopback connects.
TEST(GlooCommunicatorTest, AHostedStoreListensOnMasterAddrOnly) {
  const in_addr_t external = NonLoopbackAddress();
  if (external == 0) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to test";
  GlooOptions options = SingleRank();
  options.master_port = FreePort();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> communicator,
                       CreateGlooCommunicator(options));
  EXPECT_EQ(ConnectErrno(external, options.master_port), ECONNREFUSED);
  EXPECT_EQ(ConnectErrno(htonl(INADDR_LOOPBACK), options.master_port), 0);
}

// MASTER_ADDR that is not an address of this host cannot be hosted: said at once, naming it.
TEST(GlooCommunicatorTest, AStoreCannotBeHostedOnAnotherHostsAddress) {
  GlooOptions options = SingleRank();
  options.master_addr = "192.0.2.1";  // TEST-NET-1 (RFC 5737): never this host's
  options.master_port = FreePort();
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("gloo: rank 0: cannot host the TCPStore at 192.0.2.1:",
                                              options.master_port,
                                              ": cannot bind or listen: Cannot assign requested "
                                              "address (MASTER_ADDR must be an address of this "
                                              "host)"))));
}

// A rank whose job token differs from the store's, or that has none where the store has one, is
// refused before it joins, naming the variable.
TEST(GlooCommunicatorTest, AWrongJobTokenIsRefused) {
  auto store = ServerStore();
  GlooOptions options = SingleRank();
  options.job_token = "secret-a";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> first, CreateGlooCommunicator(store, options));
  options.job_token = "secret-b";
  EXPECT_THAT(CreateGlooCommunicator(store, options),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("gloo: rank 0: the job token (ORTHOSHARD_JOB_TOKEN) does not "
                                 "match the one the TCPStore at the given store was started with")));
  options.job_token = "";
  EXPECT_THAT(CreateGlooCommunicator(store, options),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("gloo: rank 0: the job token (ORTHOSHARD_JOB_TOKEN) is not set, "
                                 "but the TCPStore at the given store was started with one")));
}

TEST(GlooCommunicatorTest, RejectsBadOptions) {
  GlooOptions options = SingleRank();
  options.rank = 1;
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 must be in [0, size) with size 1")));
  options = SingleRank();
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeouts must be positive")));
  options = SingleRank();
  options.host_store = false;
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("master_port 0 is not a usable port")));
}

TEST(GlooCommunicatorTest, PeerThatNeverArrivesFailsTheRendezvousInTime) {
  GlooOptions options = SingleRank();
  options.size = 2;
  options.rendezvous_timeout = absl::Seconds(1);
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("gloo rendezvous of rank 0 of 2 failed")));
}

// Something listens at MASTER_PORT, accepts connections and never answers: c10d's TCPStore client
// would wait forever (over 100 s measured, whatever its timeout); the rendezvous gives up after
// rendezvous_timeout + 5 s, saying what it waited for and what to check.
TEST(GlooCommunicatorTest, AStoreThatNeverAnswersFailsTheRendezvousInTime) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 16), 0);  // the kernel accepts; nobody reads or writes
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  GlooOptions options = SingleRank();
  options.size = 2;
  options.rank = 1;
  options.host_store = false;
  options.master_port = ntohs(addr.sin_port);
  options.rendezvous_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  EXPECT_THAT(CreateGlooCommunicator(options),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(absl::StrCat("gloo: rank 1: no answer from the TCPStore at "
                                                    "127.0.0.1:", options.master_port)),
                             HasSubstr("check MASTER_ADDR and MASTER_PORT"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // bounded (6 s), not a timing measurement
  close(listener);
}

// A rank that finds another job's store at its address fails at once naming both jobs, instead of
// waiting out the rendezvous (301 s measured) or, worse, joining that job.
TEST(GlooCommunicatorTest, AnotherJobsStoreIsRefused) {
  auto store = ServerStore();
  GlooOptions options = SingleRank();
  options.job_id = "job-a";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> first, CreateGlooCommunicator(store, options));
  options.job_id = "job-b";
  EXPECT_THAT(CreateGlooCommunicator(store, options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("gloo: rank 0: the TCPStore at the given store belongs to another "
                                 "job (it holds 'job job-a, world size 1'; this rank is 'job "
                                 "job-b, world size 1')")));
  // The next attempt of the same job rendezvouses under its own prefix.
  options.job_id = "job-a";
  options.attempt = 1;
  EXPECT_OK(CreateGlooCommunicator(store, options).status());
}

// A second process claiming a rank that another process of the same job holds (the same RANK
// started twice) fails at once, naming the rank, both processes and the likely cause, instead of
// breaking the engine's rendezvous. The same process may join again.
TEST(GlooCommunicatorTest, ARankStartedTwiceIsRefused) {
  auto store = ServerStore();
  GlooOptions options = SingleRank();
  options.job_id = "job-a";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> first, CreateGlooCommunicator(store, options));
  EXPECT_OK(CreateGlooCommunicator(store, options).status());
  // Another process (here: its claim, as it would have written it) holds rank 0 of attempt 1.
  const std::string other = "host elsewhere pid 4242";
  store->set("orthoshard/attempt1/rank/0", std::vector<uint8_t>(other.begin(), other.end()));
  options.attempt = 1;
  const absl::Time start = absl::Now();
  EXPECT_THAT(CreateGlooCommunicator(store, options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("gloo: rank 0: rank 0 of job job-a is already taken by host "
                                       "elsewhere pid 4242 (this is host "),
                             HasSubstr("): rank 0 was probably started twice"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // at once, not after a timeout
}

TEST(GlooCommunicatorTest, SingleRankCollectivesAndLaunchValidation) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm, CreateGlooCommunicator(SingleRank()));
  EXPECT_EQ(comm->backend_name(), "gloo");
  EXPECT_EQ(comm->device(), at::Device(at::kCPU));
  at::Tensor t = at::zeros({4}, at::kFloat).add_(3);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, comm->AllReduce(t, {ReduceOp::kAvg}));
  EXPECT_OK(work->Wait(absl::Seconds(10)));
  EXPECT_OK(work->Wait(absl::Seconds(10)));  // waiting again is fine
  EXPECT_EQ(t.sum().item<float>(), 12.0f);

  at::Tensor matrix = at::zeros({4, 4}, at::kFloat);
  EXPECT_THAT(comm->AllReduce(matrix.t()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("op 0 (all_reduce) tensor must be contiguous")));
  EXPECT_THAT(comm->AllGather(at::zeros({4}, at::kFloat), at::zeros({4}, at::kBFloat16)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("output dtype BFloat16 differs from input dtype Float")));
  EXPECT_THAT(comm->ReduceScatter(at::zeros({4}, at::kFloat), at::zeros({3}, at::kFloat)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("output has 3 elements, rank 0's shard has 4")));
  EXPECT_THAT(comm->Broadcast(t, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 1 is outside [0, 1)")));
  EXPECT_THAT(comm->AllReduce(at::Tensor()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("all_reduce"), HasSubstr("is undefined"))));
  EXPECT_EQ(comm->traffic().Calls(OpKind::kAllReduce), 1);
  EXPECT_EQ(comm->traffic().Bytes(OpKind::kAllReduce), 16);

  // All-to-all at one rank: a local copy, nothing on the wire.
  at::Tensor rows = at::arange(6, at::kLong).reshape({3, 2});
  at::Tensor copied = at::zeros({3, 2}, at::kLong);
  ASSERT_OK_AND_ASSIGN(work, comm->AllToAll(rows, copied, {{3}, {3}}));
  EXPECT_OK(work->Wait(absl::Seconds(10)));
  EXPECT_TRUE(copied.equal(rows));
  EXPECT_THAT(comm->AllToAll(rows, at::zeros({2, 2}, at::kLong), {{3}, {3}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("op 0 (all_to_all): output_split_sizes [3] sum to 3, expected "
                                 "output dim 0 of 2")));
  EXPECT_EQ(comm->traffic().Calls(OpKind::kAllToAll), 1);
  EXPECT_EQ(comm->traffic().Bytes(OpKind::kAllToAll), 48);
  EXPECT_EQ(comm->traffic().WireBytes(OpKind::kAllToAll), 0);
  EXPECT_STREQ(OpKindName(OpKind::kAllToAll), "all_to_all");

  // AllRanksOk: one float all-reduce each.
  ASSERT_OK_AND_ASSIGN(const bool all_ok, AllRanksOk(*comm, true));
  EXPECT_TRUE(all_ok);
  ASSERT_OK_AND_ASSIGN(const bool one_failed, AllRanksOk(*comm, false));
  EXPECT_FALSE(one_failed);
  EXPECT_EQ(comm->traffic().Calls(OpKind::kAllReduce), 3);
}

}  // namespace
}  // namespace orthoshard::collectives
