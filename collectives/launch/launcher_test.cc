#include "collectives/launch/launcher.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kChild[] = "collectives/launch/testing/launcher_test_child";

struct Captured {
  std::vector<std::string> out;
  std::vector<std::string> err;
};

LaunchOptions Options(const std::string& mode, int nprocs, Captured* captured) {
  LaunchOptions options;
  options.binary = kChild;
  options.args = {mode};
  options.nprocs = nprocs;
  options.timeout = absl::Seconds(30);
  options.output = [captured](absl::string_view line, bool is_stderr) {
    (is_stderr ? captured->err : captured->out).emplace_back(line);
  };
  return options;
}

TEST(LauncherTest, PrefixesEveryLineWithItsRank) {
  Captured captured;
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(Options("print", 3, &captured)));
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.rank_exit_codes, ElementsAre(0, 0, 0));
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(captured.out, Contains(absl::StrCat("[rank ", r, "] hello from ", r, " of 3")));
    EXPECT_THAT(captured.out, Contains(absl::StrCat("[rank ", r, "] no newline at the end")));
    EXPECT_THAT(captured.err, Contains(absl::StrCat("[rank ", r, "] error line ", r)));
  }
  EXPECT_EQ(captured.out.size(), 6u);
}

TEST(LauncherTest, SetsTorchrunEnvironmentAndHostsTheStore) {
  Captured captured;
  LaunchOptions options = Options("env", 2, &captured);
  options.env = {{"EXTRA", "x"}};
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(captured.out,
                Contains(absl::StrCat("[rank ", r, "] RANK=", r, " LOCAL_RANK=", r,
                                      " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                                      "AGENT_STORE=True EXTRA=x")));
  }
  int port = 0;
  for (const std::string& line : captured.out) {
    if (absl::StrContains(line, "MASTER_PORT=")) {
      ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.find('=') + 1), &port)) << line;
    }
  }
  EXPECT_GT(port, 0);
}

// A numeric address of this machine that is not loopback (getifaddrs), or "" when it has none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (const ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
    if (a->ifa_addr->sa_family != AF_INET) continue;  // IPv6 link-local ones need a scope
    char text[NI_MAXHOST] = {};
    if (getnameinfo(a->ifa_addr, sizeof(sockaddr_in), text, sizeof(text), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      found = text;
    }
  }
  freeifaddrs(list);
  return found;
}

// The local job's store listens on loopback only: a client on another host (here: this host
// through its external address) is refused before it can read or write a key.
TEST(LauncherTest, TheStoreIsReachableFromLoopbackOnly) {
  const std::string external = NonLoopbackAddress();
  if (external.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to test";
  Captured captured;
  LaunchOptions options = Options("connect", 1, &captured);
  options.env = {{"PROBE_ADDR", external}};
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(captured.out, ElementsAre(absl::StrCat("[rank 0] ", external, ": Connection refused"),
                                        "[rank 0] 127.0.0.1: connected"));
}

TEST(LauncherTest, ReturnsFirstNonZeroExitCodeAndKillsTheRestAfterGrace) {
  Captured captured;
  LaunchOptions options = Options("fail", 3, &captured);
  options.grace_period = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.first_failed_rank, 1);
  EXPECT_TRUE(result.killed_after_failure);
  EXPECT_THAT(result.rank_exit_codes, ElementsAre(128 + SIGKILL, 3, 128 + SIGKILL));
}

// A stopped rank never exits by itself: once every other rank has ended after a failure, the
// launcher kills it at once and names it, instead of waiting out the grace period (here 10 min,
// beyond the run's 30 s bound: waiting it out fails with kDeadlineExceeded).
TEST(LauncherTest, KillsAStoppedRankOnceTheOthersEndedAndNamesIt) {
  Captured captured;
  LaunchOptions options = Options("stop", 3, &captured);
  options.grace_period = absl::Minutes(10);
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.first_failed_rank, 0);
  EXPECT_THAT(result.rank_exit_codes, ElementsAre(3, 128 + SIGKILL, 1));
  EXPECT_THAT(result.stopped_ranks, ElementsAre(1));
  EXPECT_TRUE(result.killed_after_failure);
  EXPECT_EQ(DescribeStopped(result.stopped_ranks),
            "rank 1 was stopped (SIGSTOP or SIGTSTP: state T) after the other ranks ended; killed "
            "it");
  EXPECT_EQ(DescribeStopped({}), "");
  EXPECT_EQ(DescribeStopped({1, 2}),
            "ranks 1, 2 were stopped (SIGSTOP or SIGTSTP: state T) after the other ranks ended; "
            "killed them");
}

TEST(LauncherTest, ForwardsSigtermToEveryRank) {
  Captured captured;
  LaunchOptions options = Options("wait_signal", 2, &captured);
  int ready = 0;
  options.output = [&](absl::string_view line, bool) {
    captured.out.emplace_back(line);
    if (absl::EndsWith(line, "] ready") && ++ready == 2) kill(getpid(), SIGTERM);
  };
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 7);
  EXPECT_THAT(result.rank_exit_codes, ElementsAre(7, 7));
  EXPECT_THAT(captured.out, Contains("[rank 0] got SIGTERM"));
  EXPECT_THAT(captured.out, Contains("[rank 1] got SIGTERM"));
}

TEST(LauncherTest, TimeoutKillsEveryRank) {
  Captured captured;
  LaunchOptions options = Options("fail", 1, &captured);
  options.timeout = absl::Milliseconds(300);
  EXPECT_THAT(LaunchLocal(options),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("ranks [0] of")));
}

TEST(LauncherTest, RejectsBadOptions) {
  Captured captured;
  LaunchOptions options = Options("print", 0, &captured);
  EXPECT_THAT(LaunchLocal(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("nprocs must be at least 1, got 0")));
  options = Options("print", 1, &captured);
  options.binary = "collectives/testing/no_such_binary";
  ASSERT_OK_AND_ASSIGN(LaunchResult result, LaunchLocal(options));
  EXPECT_EQ(result.exit_code, 127);
  EXPECT_THAT(captured.err, Contains("[rank 0] launcher: execve failed"));
}

// A rank's death by a signal names the signal and its likely cause: SIGBUS, every rank at once, is
// what truncating a token file they all map under a running job does.
TEST(DescribeExitCode, NamesTheSignalAndItsLikelyCause) {
  EXPECT_EQ(DescribeExitCode(2), "exit code 2");
  EXPECT_EQ(DescribeExitCode(128 + SIGBUS),
            "exit code 135 (killed by SIGBUS: a memory-mapped file it reads, a token file or a "
            "checkpoint shard, was truncated or changed in place under the job)");
  EXPECT_THAT(DescribeExitCode(128 + SIGKILL),
              HasSubstr("exit code 137 (killed by SIGKILL: from outside the program: the kernel's "
                        "out-of-memory killer"));
  EXPECT_EQ(DescribeExitCode(128 + SIGTERM), "exit code 143 (killed by SIGTERM)");
  EXPECT_EQ(DescribeExitCode(128 + SIGUSR1), absl::StrCat("exit code ", 128 + SIGUSR1,
                                                          " (killed by signal ", SIGUSR1, ")"));
  EXPECT_EQ(DescribeExitCode(255), "exit code 255");
}

TEST(LauncherTest, AProgramRunDirectlyStartsItsOwnRanks) {
  // Run as a user would, outside any launcher (no rendezvous variables in its environment).
  const std::string command =
      absl::StrCat("env -u RANK -u WORLD_SIZE -u SLURM_PROCID ", kChild, " self 2>&1");
  std::FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::vector<std::string> lines;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    std::string line(buffer);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    lines.push_back(line);
  }
  const int status = pclose(pipe);
  EXPECT_THAT(lines, Contains("[rank 0] self rank 0 of 2"));
  EXPECT_THAT(lines, Contains("[rank 1] self rank 1 of 2"));
  ASSERT_TRUE(WIFEXITED(status)) << absl::StrJoin(lines, "\n");
  EXPECT_EQ(WEXITSTATUS(status), 5) << absl::StrJoin(lines, "\n");  // rank 1's exit code
}

}  // namespace
}  // namespace orthoshard::collectives
