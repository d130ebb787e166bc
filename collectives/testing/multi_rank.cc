#include "collectives/testing/multi_rank.h"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "collectives/gloo_communicator.h"
#include "collectives/internal/c10d_communicator.h"
#include "collectives/internal/job_store.h"
#include "collectives/rendezvous.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives::testing {
namespace {

constexpr char kCaseVariable[] = "ORTHOSHARD_MULTI_RANK_CASE";

// Calls of RunOnRanks made so far by the running test; reset when a test starts (also when one
// runs again under --gtest_repeat).
int g_calls_in_test = 0;

class CallCounterReset : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { g_calls_in_test = 0; }
};

// "<suite>.<test>#<call>" of the current RunOnRanks call of the running test.
std::string NextCaseName() {
  static const bool listening = [] {
    // gtest owns the listener. Installed during the first test, so that test's count starts here.
    ::testing::UnitTest::GetInstance()->listeners().Append(new CallCounterReset());
    return true;
  }();
  (void)listening;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test =
      info == nullptr ? std::string("<no test>")
                      : absl::StrCat(info->test_suite_name(), ".", info->name());
  return absl::StrCat(test, "#", g_calls_in_test++);
}

std::string ResultLine(const std::string& case_name, bool passed, int rank) {
  return absl::StrCat("multi-rank case ", case_name, passed ? " passed" : " failed", " on rank ",
                      rank);
}

// Counts this rank in at key `case_name` of the job's store and waits until all `world` have. The
// store is reached as the engines reach it (ConnectJobStore: a bounded connect, the job checked).
absl::Status MeetInStore(const std::string& case_name, int world, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const RendezvousInfo info, ParseRendezvous(ProcessEnvironment()));
  internal_collectives::StoreRendezvous where;
  where.engine = "multi-rank test";
  where.rank = info.rank;
  where.master_addr = info.master_addr;
  where.master_port = info.master_port;
  where.host_store = info.HostsStore();
  where.timeout = timeout;
  where.job = {info.job_id, info.attempt, info.world_size, info.rank, info.job_token};
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store,
                   internal_collectives::ConnectJobStore(where));
  const std::string key = absl::StrCat("multi_rank/", case_name, "/joined");
  try {
    store->add(key, 1);
    const absl::Time deadline = absl::Now() + timeout;
    while (store->add(key, 0) < world) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("only ", store->add(key, 0), " of ", world,
                                                        " ranks joined within ",
                                                        absl::FormatDuration(timeout)));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("the job's store: ", e.what()));
  }
  return absl::OkStatus();
}

// In a rank process: joins, runs the body, reports and ends the process.
[[noreturn]] void RunRank(const std::string& case_name,
                          const std::function<void(Communicator&)>& body,
                          const MultiRankOptions& options) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      options.join ? options.join(options.collective_timeout)
                   : JoinGlooFromEnvironment(options.collective_timeout, absl::Seconds(60));
  int rank = -1;
  if (!comm.ok()) {
    ADD_FAILURE() << "joining the communicator: " << comm.status();
  } else {
    rank = (*comm)->rank();
    // Every rank has joined before any body runs: a rank that finished a body without collectives
    // and exited could otherwise close its connections while a peer is still connecting to it.
    // The ranks meet in the launcher's store, not in a collective, so that the body's collectives
    // are numbered from #1 as in any program.
    const absl::Status joined = MeetInStore(case_name, (*comm)->size(), options.collective_timeout);
    if (!joined.ok()) ADD_FAILURE() << "waiting for every rank to join: " << joined;
  }
  if (comm.ok() && !::testing::Test::HasFailure()) {
    try {
      body(**comm);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "exception on rank " << rank << ": " << e.what();
    }
  }
  const bool passed = !::testing::Test::HasFailure();
  std::printf("%s\n", ResultLine(case_name, passed, rank).c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  // The communicator is left alive: peers may still be inside a collective, and joining the
  // engine's threads at exit could wait on them.
  if (comm.ok()) comm->release();
  std::_Exit(passed ? 0 : 1);
}

std::string SelfBinary() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : std::string();
}

}  // namespace

bool InRankProcess() { return std::getenv(kCaseVariable) != nullptr; }

std::string MultiRankOutcome::Transcript() const {
  std::vector<std::string> all;
  for (size_t r = 0; r < lines.size(); ++r) {
    for (const std::string& line : lines[r]) all.push_back(absl::StrCat("[rank ", r, "] ", line));
  }
  return absl::StrJoin(all, "\n");
}

MultiRankOutcome LaunchOnRanks(int world, const std::function<void(Communicator&)>& body,
                               const MultiRankOptions& options) {
  const std::string case_name = NextCaseName();
  MultiRankOutcome outcome;
  if (const char* running = std::getenv(kCaseVariable); running != nullptr) {
    if (case_name == running) RunRank(case_name, body, options);
    return outcome;  // another call of this test is the one this rank process runs
  }
  outcome.passed.assign(world, false);
  outcome.lines.resize(world);
  LaunchOptions launch;
  launch.binary = SelfBinary();
  const std::string test = case_name.substr(0, case_name.rfind('#'));
  // --gtest_output= keeps the ranks from writing Bazel's test.xml (XML_OUTPUT_FILE) over the
  // test's own.
  launch.args = {absl::StrCat("--gtest_filter=", test), "--gtest_output=", "--gtest_brief=1"};
  launch.nprocs = world;
  launch.timeout = options.launch_timeout;
  launch.grace_period = options.grace_period;
  launch.forward_signals = false;
  launch.env = options.env;
  launch.env.push_back({kCaseVariable, case_name});
  // Not Bazel's test sharding (the filter names one test) nor its premature-exit marker (ranks end
  // with _Exit).
  launch.env.push_back({"GTEST_TOTAL_SHARDS", "1"});
  launch.env.push_back({"GTEST_SHARD_INDEX", "0"});
  launch.env.push_back({"TEST_PREMATURE_EXIT_FILE", ""});
  launch.output = [&outcome, world](absl::string_view line, bool) {
    int rank = -1;
    if (absl::ConsumePrefix(&line, "[rank ")) {
      const size_t end = line.find("] ");
      if (end != absl::string_view::npos && absl::SimpleAtoi(line.substr(0, end), &rank) &&
          rank >= 0 && rank < world) {
        line.remove_prefix(end + 2);
      } else {
        rank = -1;
      }
    }
    if (rank < 0) rank = 0;  // the launcher's own messages go with rank 0's
    outcome.lines[rank].emplace_back(line);
    // Into the test's log as well (Bazel keeps it), as the ranks print it.
    std::printf("[rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
  };
  absl::StatusOr<LaunchResult> result = LaunchLocal(launch);
  if (!result.ok()) {
    ADD_FAILURE() << "launching " << world << " ranks of " << case_name << ": " << result.status()
                  << "\n"
                  << outcome.Transcript();
    return outcome;
  }
  outcome.launch = *result;
  for (int r = 0; r < world; ++r) {
    for (const std::string& line : outcome.lines[r]) {
      if (line == ResultLine(case_name, true, r)) outcome.passed[r] = true;
    }
  }
  return outcome;
}

void RunOnRanks(int world, const std::function<void(Communicator&)>& body,
                const MultiRankOptions& options) {
  const MultiRankOutcome outcome = LaunchOnRanks(world, body, options);
  if (InRankProcess() || outcome.launch.rank_exit_codes.empty()) return;
  for (int r = 0; r < world; ++r) {
    if (outcome.passed[r] && outcome.launch.rank_exit_codes[r] == 0) continue;
    ADD_FAILURE() << "rank " << r << " of " << world << " failed (exit code "
                  << outcome.launch.rank_exit_codes[r] << "); its output:\n"
                  << absl::StrJoin(outcome.lines[r], "\n");
  }
}

}  // namespace orthoshard::collectives::testing
