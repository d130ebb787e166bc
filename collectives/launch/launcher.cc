#include "collectives/launch/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/internal/job_store.h"
#include "collectives/rendezvous.h"

extern char** environ;

namespace orthoshard::collectives {
namespace {

std::atomic<bool> g_running{false};
int g_signal_pipe_write = -1;

void ForwardingHandler(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_signal_pipe_write >= 0) {
    ssize_t ignored = write(g_signal_pipe_write, &byte, 1);
    (void)ignored;
  }
}

int EncodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

// One output stream of one rank: a pipe and the partial line read so far.
struct Stream {
  int fd = -1;
  int rank = 0;
  bool is_stderr = false;
  std::string partial;
};

struct Child {
  pid_t pid = -1;
  bool running = false;
};

class SignalForwarding {
 public:
  explicit SignalForwarding(bool enabled) {
    if (!enabled) return;
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) return;
    g_signal_pipe_write = fds_[1];
    struct sigaction action = {};
    action.sa_handler = ForwardingHandler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
    sigaction(SIGHUP, &action, &old_hup_);
    installed_ = true;
  }
  ~SignalForwarding() {
    if (!installed_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGHUP, &old_hup_, nullptr);
    g_signal_pipe_write = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  int read_fd() const { return installed_ ? fds_[0] : -1; }

 private:
  bool installed_ = false;
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
  struct sigaction old_hup_ = {};
};

void DefaultOutput(absl::string_view line, bool is_stderr) {
  FILE* out = is_stderr ? stderr : stdout;
  fwrite(line.data(), 1, line.size(), out);
  fputc('\n', out);
  fflush(out);
}

class Run {
 public:
  explicit Run(const LaunchOptions& options) : options_(options) {
    output_ = options.output ? options.output : DefaultOutput;
    // Names this launch in the store (the ranks check it: a rank of another job that finds this
    // store at its MASTER_PORT fails at once instead of joining).
    std::random_device random;
    job_id_ = absl::StrCat("local-", getpid(), "-", absl::Hex(random(), absl::kZeroPad8));
    // The job's token (JobIdentity::token): the caller's ORTHOSHARD_JOB_TOKEN, else 128 random
    // bits, so that only this launch's ranks join its store.
    if (const char* inherited = getenv("ORTHOSHARD_JOB_TOKEN")) job_token_ = inherited;
    for (const auto& [key, value] : options.env) {
      if (key == "ORTHOSHARD_JOB_TOKEN") job_token_ = value;
    }
    if (job_token_.empty()) {
      for (int i = 0; i < 4; ++i) absl::StrAppend(&job_token_, absl::Hex(random(), absl::kZeroPad8));
    }
  }

  absl::StatusOr<LaunchResult> Execute() {
    // Installed first so that it is restored last: the hosted store's teardown below can take a
    // while, and a signal arriving then must still be forwarded (to ranks already gone), not kill
    // this process with the job's result not yet returned.
    SignalForwarding forwarding(options_.forward_signals);
    int port = options_.master_port;
    c10::intrusive_ptr<c10d::TCPStore> store;
    if (options_.host_store) {
      // On loopback only: a local job is not reachable from other hosts.
      absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> hosted =
          internal_collectives::HostTcpStore("launcher", "127.0.0.1", 0, absl::Seconds(60));
      if (!hosted.ok()) return hosted.status();
      store = *std::move(hosted);
      try {
        port = store->getPort();
        const std::string token = absl::StrCat("token:", job_token_);  // as JoinJobStore writes it
        store->set(internal_collectives::kJobTokenKey,
                   std::vector<uint8_t>(token.begin(), token.end()));
      } catch (const std::exception& e) {
        return absl::UnavailableError(absl::StrCat("launcher: cannot host a TCPStore: ", e.what()));
      }
    }
    children_.resize(options_.nprocs);
    result_.rank_exit_codes.assign(options_.nprocs, -1);
    for (int rank = 0; rank < options_.nprocs; ++rank) {
      absl::Status started = Start(rank, port);
      if (!started.ok()) {
        KillAll(SIGKILL);
        ReapAll();
        return started;
      }
    }
    return Loop(forwarding.read_fd());
  }

  ~Run() {
    for (Stream& s : streams_) {
      if (s.fd >= 0) close(s.fd);
    }
  }

 private:
  absl::Status Start(int rank, int port) {
    std::vector<std::string> env_strings;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) env_strings.emplace_back(*e);
    const std::vector<std::pair<std::string, std::string>> rendezvous = {
        {"RANK", absl::StrCat(rank)},
        {"LOCAL_RANK", absl::StrCat(rank)},
        {"WORLD_SIZE", absl::StrCat(options_.nprocs)},
        {"LOCAL_WORLD_SIZE", absl::StrCat(options_.nprocs)},
        {"GROUP_RANK", "0"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", absl::StrCat(port)},
        {"TORCHELASTIC_USE_AGENT_STORE", options_.host_store ? "True" : "False"},
        {"ORTHOSHARD_JOB_ID", job_id_},
        {"ORTHOSHARD_JOB_TOKEN", job_token_},
    };
    auto set = [&](const std::string& key, const std::string& value) {
      const std::string prefix = key + "=";
      for (std::string& s : env_strings) {
        if (s.compare(0, prefix.size(), prefix) == 0) {
          s = prefix + value;
          return;
        }
      }
      env_strings.push_back(prefix + value);
    };
    for (const auto& [k, v] : rendezvous) set(k, v);
    for (const auto& [k, v] : options_.env) set(k, v);

    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_strings = {options_.binary};
    arg_strings.insert(arg_strings.end(), options_.args.begin(), options_.args.end());
    std::vector<char*> argv;
    for (std::string& s : arg_strings) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return Errno("pipe");
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return Errno("pipe");
    }
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
      return Errno("fork");
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      setpgid(0, 0);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      sigaction(SIGINT, &dfl, nullptr);
      sigaction(SIGTERM, &dfl, nullptr);
      sigaction(SIGHUP, &dfl, nullptr);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      execve(argv[0], argv.data(), envp.data());
      const char msg[] = "launcher: execve failed\n";
      ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
      (void)ignored;
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    streams_.push_back(Stream{out[0], rank, false, ""});
    streams_.push_back(Stream{err[0], rank, true, ""});
    children_[rank] = Child{pid, true};
    return absl::OkStatus();
  }

  static absl::Status Errno(const char* what) {
    return absl::UnavailableError(absl::StrCat("launcher: ", what, " failed: ", strerror(errno)));
  }

  void Emit(Stream& s, absl::string_view line) {
    output_(absl::StrCat("[rank ", s.rank, "] ", line), s.is_stderr);
  }

  // Reads what is available; returns false at EOF.
  bool Drain(Stream& s) {
    char buffer[4096];
    while (true) {
      const ssize_t n = read(s.fd, buffer, sizeof(buffer));
      if (n > 0) {
        s.partial.append(buffer, static_cast<size_t>(n));
        size_t newline;
        while ((newline = s.partial.find('\n')) != std::string::npos) {
          Emit(s, absl::string_view(s.partial).substr(0, newline));
          s.partial.erase(0, newline + 1);
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      if (!s.partial.empty()) Emit(s, s.partial);
      s.partial.clear();
      close(s.fd);
      s.fd = -1;
      return false;
    }
  }

  void KillAll(int sig) {
    for (Child& c : children_) {
      if (c.running) kill(c.pid, sig);
    }
  }

  void ReapAll() {
    for (Child& c : children_) {
      if (c.running) {
        int status = 0;
        waitpid(c.pid, &status, 0);
        c.running = false;
      }
    }
  }

  void Reap() {
    for (int rank = 0; rank < static_cast<int>(children_.size()); ++rank) {
      Child& c = children_[rank];
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      const int code = EncodeWaitStatus(status);
      result_.rank_exit_codes[rank] = code;
      if (code != 0 && result_.exit_code == 0) {
        result_.exit_code = code;
        result_.first_failed_rank = rank;
        kill_at_ = absl::Now() + options_.grace_period;
      }
    }
  }

  // Whether rank `c` is stopped by a signal (state 'T' in /proc/PID/stat; the state follows the
  // command name, which may itself contain ") ", so it is read after the last ')').
  static bool IsStopped(const Child& c) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(c.pid));
    std::FILE* f = std::fopen(path, "r");
    if (f == nullptr) return false;
    char buffer[512];
    const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
    std::fclose(f);
    const std::string stat(buffer, n);
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
  }

  // After a failure (or a forwarded signal): when every rank still running is stopped, none of
  // them will exit by itself, so the grace ends now: they are SIGKILLed and named.
  void KillIfOnlyStoppedRemain() {
    if (kill_at_ == absl::InfiniteFuture() || !AnyRunning()) return;
    std::vector<int> stopped;
    for (int rank = 0; rank < static_cast<int>(children_.size()); ++rank) {
      const Child& c = children_[rank];
      if (!c.running) continue;
      if (!IsStopped(c)) return;
      stopped.push_back(rank);
    }
    result_.stopped_ranks = stopped;
    KillAll(SIGKILL);
    result_.killed_after_failure = true;
  }

  bool AnyRunning() const {
    for (const Child& c : children_) {
      if (c.running) return true;
    }
    return false;
  }

  absl::StatusOr<LaunchResult> Loop(int signal_fd) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    absl::Time drain_until = absl::InfiniteFuture();
    while (true) {
      std::vector<pollfd> fds;
      std::vector<Stream*> polled;
      for (Stream& s : streams_) {
        if (s.fd < 0) continue;
        fds.push_back(pollfd{s.fd, POLLIN, 0});
        polled.push_back(&s);
      }
      if (signal_fd >= 0) fds.push_back(pollfd{signal_fd, POLLIN, 0});
      poll(fds.data(), fds.size(), 20);
      for (size_t i = 0; i < polled.size(); ++i) {
        if (fds[i].revents != 0) Drain(*polled[i]);
      }
      if (signal_fd >= 0 && fds.back().revents != 0) {
        unsigned char sig = 0;
        while (read(signal_fd, &sig, 1) == 1) {
          KillAll(sig);
          if (kill_at_ == absl::InfiniteFuture()) kill_at_ = absl::Now() + options_.grace_period;
        }
      }
      Reap();
      KillIfOnlyStoppedRemain();
      const absl::Time now = absl::Now();
      if (AnyRunning() && now >= kill_at_) {
        KillAll(SIGKILL);
        result_.killed_after_failure = true;
      }
      if (AnyRunning() && now >= deadline) {
        std::vector<int> running;
        for (int r = 0; r < static_cast<int>(children_.size()); ++r) {
          if (children_[r].running) running.push_back(r);
        }
        KillAll(SIGKILL);
        ReapAll();
        return absl::DeadlineExceededError(absl::StrCat(
            "launcher: ranks [", absl::StrJoin(running, ","), "] of ", options_.binary,
            " still running after ", absl::FormatDuration(options_.timeout), "; killed"));
      }
      if (!AnyRunning()) {
        // Grandchildren may hold a pipe open; give the output a moment, then stop.
        if (drain_until == absl::InfiniteFuture()) drain_until = now + absl::Seconds(1);
        bool open = false;
        for (const Stream& s : streams_) open = open || s.fd >= 0;
        if (!open || now >= drain_until) return result_;
      }
    }
  }

  const LaunchOptions& options_;
  std::string job_id_;
  std::string job_token_;
  std::function<void(absl::string_view, bool)> output_;
  std::vector<Child> children_;
  std::vector<Stream> streams_;
  LaunchResult result_;
  absl::Time kill_at_ = absl::InfiniteFuture();
};

}  // namespace

std::string DescribeExitCode(int code) {
  if (code <= 128 || code >= 128 + 65) return absl::StrCat("exit code ", code);
  struct Known {
    int signal;
    const char* name;
    const char* cause;  // "" when the name says enough
  };
  static constexpr Known kKnown[] = {
      {SIGBUS, "SIGBUS",
       "a memory-mapped file it reads, a token file or a checkpoint shard, was truncated or "
       "changed in place under the job"},
      {SIGSEGV, "SIGSEGV", "an invalid memory access (a crash; its stderr above may say where)"},
      {SIGABRT, "SIGABRT", "an abort: a failed check or an uncaught exception (see its stderr above)"},
      {SIGKILL, "SIGKILL",
       "from outside the program: the kernel's out-of-memory killer, a scheduler, a user, or the "
       "launcher after another rank failed"},
      {SIGFPE, "SIGFPE", "an arithmetic fault"},
      {SIGILL, "SIGILL", "an instruction this CPU does not have (a build for another machine?)"},
      {SIGTERM, "SIGTERM", ""},
      {SIGINT, "SIGINT", ""},
      {SIGHUP, "SIGHUP", ""},
      {SIGPIPE, "SIGPIPE", "a write to a pipe or socket whose reader had gone"},
  };
  const int sig = code - 128;
  for (const Known& known : kKnown) {
    if (known.signal != sig) continue;
    return absl::StrCat("exit code ", code, " (killed by ", known.name,
                        *known.cause != '\0' ? ": " : "", known.cause, ")");
  }
  return absl::StrCat("exit code ", code, " (killed by signal ", sig, ")");
}

std::string DescribeStopped(const std::vector<int>& stopped_ranks) {
  if (stopped_ranks.empty()) return "";
  const bool one = stopped_ranks.size() == 1;
  return absl::StrCat(one ? "rank " : "ranks ", absl::StrJoin(stopped_ranks, ", "),
                      one ? " was" : " were",
                      " stopped (SIGSTOP or SIGTSTP: state T) after the other ranks ended; killed ",
                      one ? "it" : "them");
}

absl::StatusOr<LaunchResult> LaunchLocal(const LaunchOptions& options) {
  if (options.nprocs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher: nprocs must be at least 1, got ", options.nprocs));
  }
  if (options.binary.empty()) return absl::InvalidArgumentError("launcher: binary is empty");
  if (g_running.exchange(true)) {
    return absl::FailedPreconditionError("launcher: another LaunchLocal is running");
  }
  absl::StatusOr<LaunchResult> result;
  {
    Run run(options);
    result = run.Execute();
  }
  g_running = false;
  return result;
}

std::optional<int> LaunchSelfUnlessRank(int argc, char** argv, int nprocs,
                                        absl::Duration timeout) {
  const absl::StatusOr<RendezvousInfo> rendezvous = ParseRendezvous(ProcessEnvironment());
  if (rendezvous.ok()) return std::nullopt;
  if (rendezvous.status().code() != absl::StatusCode::kNotFound) {
    std::fprintf(stderr, "%s: %s\n", argv[0], std::string(rendezvous.status().message()).c_str());
    return 1;
  }
  LaunchOptions options;
  options.binary = "/proc/self/exe";
  for (int i = 1; i < argc; ++i) options.args.emplace_back(argv[i]);
  options.nprocs = nprocs;
  options.timeout = timeout;
  const absl::StatusOr<LaunchResult> result = LaunchLocal(options);
  if (!result.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], result.status().ToString().c_str());
    return 1;
  }
  return result->exit_code;
}

}  // namespace orthoshard::collectives
