// A local launcher: starts N processes of one binary on this machine with torchrun's environment,
// hosts their rendezvous store, prefixes their output with "[rank N] ", forwards SIGINT, SIGTERM
// and SIGHUP, and returns the first non-zero exit code. Used by tests and by `pretrain --nproc`.
#ifndef ORTHOSHARD_COLLECTIVES_LAUNCH_LAUNCHER_H_
#define ORTHOSHARD_COLLECTIVES_LAUNCH_LAUNCHER_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace orthoshard::collectives {

struct LaunchOptions {
  std::string binary;             // executable to start (absolute or relative to the cwd)
  std::vector<std::string> args;  // arguments after argv[0]
  int nprocs = 1;                 // number of ranks
  // Extra environment for every rank, applied after the inherited environment and the rendezvous
  // variables (so it may override them).
  std::vector<std::pair<std::string, std::string>> env;
  // Host a TCPStore on a free port of 127.0.0.1 in the launcher and tell the ranks so
  // (TORCHELASTIC_USE_AGENT_STORE=True), as torchrun's agent does. Otherwise rank 0 hosts the
  // store on `master_port`.
  bool host_store = true;
  int master_port = 29500;  // used only without host_store
  // After the first rank fails, the others get this long to exit before they are SIGKILLed. The
  // grace ends early once every rank still running is stopped (state T in /proc/PID/stat: SIGSTOP,
  // SIGTSTP), which would never exit by itself: those are SIGKILLed at once (stopped_ranks). A
  // rank held by a debugger (state t) keeps its grace.
  absl::Duration grace_period = absl::Seconds(5);
  // Bound on the whole run: when it passes, every rank is SIGKILLed.
  absl::Duration timeout = absl::InfiniteDuration();
  // Forward SIGINT, SIGTERM and SIGHUP received by this process to every rank while they run.
  bool forward_signals = true;
  // Receives each output line with its "[rank N] " prefix and no newline; `is_stderr` tells the
  // stream. Called on the launching thread. Default: write to this process's stdout/stderr.
  std::function<void(absl::string_view line, bool is_stderr)> output;
};

struct LaunchResult {
  // First non-zero exit code in the order ranks ended (128 + signal number for a rank killed by a
  // signal), or 0 when every rank exited with 0.
  int exit_code = 0;
  int first_failed_rank = -1;         // rank that produced exit_code, -1 if none failed
  std::vector<int> rank_exit_codes;   // per rank, same encoding
  bool killed_after_failure = false;  // some ranks were SIGKILLed after the grace period
  // Ranks found stopped (state T) when every other rank had ended after a failure, and SIGKILLed
  // then without waiting out the grace period (their exit code: 128 + SIGKILL). Ascending.
  std::vector<int> stopped_ranks;
};

// The job's line for the ranks it found stopped and killed: "ranks 1, 2 were stopped (SIGSTOP or
// SIGTSTP: state T) after the other ranks ended; killed them" ("rank 1 was ... killed it"), or ""
// when `stopped_ranks` is empty.
std::string DescribeStopped(const std::vector<int>& stopped_ranks);

// A rank's exit code in LaunchResult's encoding, for the job's last line: "exit code 3", or for
// 128 + a signal the signal's name and its likely cause, e.g. "exit code 135 (killed by SIGBUS: a
// memory-mapped file it reads, a token file or a checkpoint shard, was truncated or changed in
// place under the job)".
std::string DescribeExitCode(int code);

// Starts `nprocs` ranks and waits for all of them. Each rank gets RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK=0, MASTER_ADDR=127.0.0.1, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE, ORTHOSHARD_JOB_ID (unique to this launch) and ORTHOSHARD_JOB_TOKEN
// (the inherited or `env`'s one, else 128 random bits; recorded in the hosted store, which listens
// on 127.0.0.1 only, so no other host and no process without the token joins the job). Ranks die with the launcher (PR_SET_PDEATHSIG), so call it from a
// thread that outlives the run. At most one LaunchLocal may run per process at a time.
// Errors: kInvalidArgument for nprocs < 1 or an empty binary; kUnavailable if the store or a
// process cannot be started; kDeadlineExceeded when `timeout` passed (every rank is killed);
// kFailedPrecondition if another LaunchLocal is running.
absl::StatusOr<LaunchResult> LaunchLocal(const LaunchOptions& options);

// For a program that starts its own ranks when run directly (benchmarks, examples): returns
// std::nullopt in a rank, i.e. when the rendezvous variables of torchrun, SLURM or LaunchLocal are
// set (ParseRendezvous finds them); otherwise starts `nprocs` copies of this binary with the
// arguments argv[1..] through LaunchLocal (bounded by `timeout`), waits, and returns the exit code
// this process should end with: the ranks' (LaunchResult::exit_code), or 1 with the reason on
// stderr when they could not be started or the rendezvous variables are malformed.
std::optional<int> LaunchSelfUnlessRank(int argc, char** argv, int nprocs,
                                        absl::Duration timeout = absl::InfiniteDuration());

}  // namespace orthoshard::collectives

#endif  // ORTHOSHARD_COLLECTIVES_LAUNCH_LAUNCHER_H_
