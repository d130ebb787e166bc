// `pretrain`: trains a GPT preset on N ranks (see integration/trainer.h for what a run does).
//
//   bazel run //integration:pretrain                       tiny model, synthetic corpus, 2 local ranks
//   pretrain --config=run.textproto --steps=50             a PretrainConfig text proto; flags win
//   torchrun --no-python --nproc-per-node=2 bazel-bin/integration/pretrain ...
//
// Without a launcher environment (torchrun's RANK/WORLD_SIZE or SLURM's variables) the binary
// validates its input, then relaunches itself on --nproc_per_node local ranks through
// collectives::LaunchLocal; under a launcher it joins the job directly. The last line on stdout
// is rank 0's summary as one JSON object (TrainSummary::ToJson).
//
// Exit codes (integration::ExitCode): 0 success; 2 bad input found before training starts (unknown
// flag, bad flag value, missing or corrupt data/config file, --device=cuda without a CUDA build or
// GPU, a --save_dir that cannot be written or already holds checkpoints without --resume, an
// incompatible resume), with one "pretrain: ..." line on stderr and nothing written; 1 any failure
// once training has begun (a lost rank, a failed save, whatever its status code) or any other;
// under the local launcher, the first failing rank's code; 128 + SIGINT/SIGTERM/SIGHUP after a
// graceful stop on that signal (the step saved, the JSON line printed with "stop_signal"), or at
// once when the signal comes during the rendezvous (one "pretrain: rank N: stopped by ..." line).
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#ifdef ORTHOSHARD_CUDA
#include <ATen/detail/CUDAHooksInterface.h>
#endif

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "checkpoint/commit.h"
#include "checkpoint/manifest.h"
#include "collectives/gloo_communicator.h"
#include "collectives/launch/launcher.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "integration/metrics/allocator_stats.h"
#include "integration/metrics/progress.h"
#include "integration/preflight.h"
#include "integration/setup.h"
#include "integration/trainer.h"
#include "integration/training_data.h"
#include "model/model.h"

namespace {
const orthoshard::integration::TrainerConfig kDefaults;
}  // namespace

// The field types as trainer_config_fields.h names them, for the flag definitions below (absl flags
// are defined in the global namespace).
namespace optimizers = ::orthoshard::optimizers;
using ::orthoshard::integration::Device;
using ::orthoshard::integration::DistMode;
using ::orthoshard::integration::FsdpGradAccum;
using ::orthoshard::integration::NsForm;
using ::orthoshard::integration::OptimizerChoice;
using ::orthoshard::integration::Precision;
using ::orthoshard::integration::RecomputeMode;
using ::orthoshard::integration::ResumeMode;
using ::orthoshard::integration::SaveFailurePolicy;
using ::orthoshard::integration::Spell;
using ::orthoshard::integration::SpellingOf;

ABSL_FLAG(std::string, config, "",
          "PretrainConfig text-format file (integration/config/pretrain_config.proto); flags given on the "
          "command line override its fields");
ABSL_FLAG(int, nproc_per_node, 2,
          "local ranks to launch when not already under a launcher (torchrun/SLURM environment)");
// Every TrainerConfig field is a flag of the same name (trainer_config_fields.h); a fixed-choice
// field's flag is a string, parsed with its choice table (choices.h) by MakeConfig.
#define ORTHOSHARD_DEFINE_FLAG(type, name, default_value, help) \
  ABSL_FLAG(SpellingOf<type>, name, Spell(kDefaults.name), help);
ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_DEFINE_FLAG)
#undef ORTHOSHARD_DEFINE_FLAG

namespace orthoshard::integration {
namespace {

constexpr char kTtyEnv[] = "ORTHOSHARD_PRETRAIN_TTY";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "pretrain: %s\n", std::string(status.message()).c_str());
  return ExitCode(status);
}

// Checks every "--name[=value]" argument against the registered flags before absl parses them, so
// that an unknown flag or a bad value is exit code 2 (absl itself exits with 1). Records the names
// given. --resume takes true, false or auto; a bare --resume (--noresume) is rewritten in argv to
// --resume=true (false), as for a bool flag. Errors: kInvalidArgument.
absl::Status PrescanFlags(int argc, char** argv, std::set<std::string>* given) {
  static char kResumeTrue[] = "--resume=true";
  static char kResumeFalse[] = "--resume=false";
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--resume" || arg == "-resume") argv[i] = kResumeTrue;
    if (arg == "--noresume" || arg == "-noresume") argv[i] = kResumeFalse;
    arg = argv[i];
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (flags are --name=value)"));
    }
    const size_t eq = arg.find('=');
    std::string name(arg.substr(0, eq));
    // absl's usage flags are not in the registry; ParseCommandLine handles them.
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
        name == "version" || name == "only_check_args" || name == "helpon" ||
        name == "helpmatch") {
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && eq == absl::string_view::npos) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        given->insert(name.substr(2));
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, "; see --help"));
    }
    given->insert(name);
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " is missing its value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, ": ", error));
    }
  }
  return absl::OkStatus();
}

// Defaults, then --config, then the flags given on the command line; the fields either names are
// recorded in TrainerConfig::given.
absl::StatusOr<TrainerConfig> MakeConfig(const std::set<std::string>& given) {
  TrainerConfig c;
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (!config_path.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(config_path, ec) &&
        !std::filesystem::is_regular_file(config_path, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config '", config_path, "': not a regular file (expected a text-format "
                       "PretrainConfig)"));
    }
    std::ifstream in(config_path);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("--config '", config_path, "': cannot open"));
    }
    std::stringstream text;
    text << in.rdbuf();
    absl::Status s = ApplyConfigText(text.str(), config_path, &c);
    if (!s.ok()) return s;
  }
  absl::Status status;
#define ORTHOSHARD_FLAG(type, name, default_value, help)                    \
  if (status.ok() && given.count(#name)) {                                   \
    status = SetFromSpelling(#name, absl::GetFlag(FLAGS_##name), &c.name);   \
    c.given.insert(#name);                                                   \
  }
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_FLAG)
#undef ORTHOSHARD_FLAG
  if (!status.ok()) return status;
  return c;
}

// Whether this binary and machine can run `config.device` with `local_ranks` ranks on this
// machine (one GPU each for cuda). Errors: kFailedPrecondition saying what is missing.
absl::Status CheckDevice(const TrainerConfig& config, int local_ranks) {
  if (config.device != Device::kCuda) return absl::OkStatus();
#ifndef ORTHOSHARD_CUDA
  (void)local_ranks;
  return absl::FailedPreconditionError(
      "--device=cuda: this pretrain was built without CUDA and NCCL; build it with "
      "`bazel build --config=cuda //integration:pretrain`");
#else
  const int gpus = at::detail::getCUDAHooks().getNumGPUs();
  if (gpus < local_ranks) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=cuda: ", local_ranks, " rank(s) on this machine need one GPU each, ",
                     gpus, " visible"));
  }
  return absl::OkStatus();
#endif
}

// The communicator of `config.device`: Gloo on the CPU, or NCCL on GPU LOCAL_RANK.
absl::StatusOr<std::unique_ptr<collectives::Communicator>> CreateCommunicator(
    const TrainerConfig& config, const collectives::RendezvousInfo& info) {
  const absl::Duration timeout = absl::Seconds(config.distributed_timeout_s);
#ifdef ORTHOSHARD_CUDA
  if (config.device == Device::kCuda) {
    collectives::NcclOptions options = collectives::NcclOptionsFromRendezvous(info);
    options.timeout = options.rendezvous_timeout = timeout;
    return collectives::CreateNcclCommunicator(options);
  }
#endif
  collectives::GlooOptions options = collectives::GlooOptionsFromRendezvous(info);
  options.timeout = options.rendezvous_timeout = timeout;
  return collectives::CreateGlooCommunicator(options);
}

// The first SIGINT, SIGTERM or SIGHUP a rank receives; Train stops gracefully when it is set.
std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_stop_signal_ns{0};  // CLOCK_MONOTONIC time of the first one
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "stored from a signal handler");

// A request repeated within this long is the same request: torchrun forwards its own SIGINT or
// SIGTERM to workers that the terminal or SLURM has already signalled.
constexpr int64_t kRepeatedSignalNs = 2'000'000'000;

// Async-signal-safe: atomics, clock_gettime, sigaction and raise only.
void StopHandler(int signal_number) {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t now_ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  int none = 0;
  if (g_stop_signal.compare_exchange_strong(none, signal_number)) {
    g_stop_signal_ns.store(now_ns);
    return;
  }
  if (now_ns - g_stop_signal_ns.load() < kRepeatedSignalNs) return;
  // Asked again later (a second Ctrl-C): die of the signal now. It is blocked while this handler
  // runs, so it is delivered, with its default action, as the handler returns.
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
  raise(signal_number);
}

// SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) ask for a graceful stop (finish
// the step, save, exit 128 + the signal). The same request delivered again within 2 s is ignored;
// a later one kills at once.
void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = StopHandler;
  sigemptyset(&action.sa_mask);
  // One handler at a time: the first signal's time is set before another is looked at.
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&action.sa_mask, signal_number);
  action.sa_flags = SA_RESTART;
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal_number, &action, nullptr);
}

// While a rank rendezvouses there is no step to finish and nothing to save, and the rendezvous
// blocks until its peers come or its timeout (--distributed_timeout_s and more) passes: SIGINT,
// SIGTERM or SIGHUP then ends the rank at once with one line on stderr and exit 128 + the signal.
// The lines are written before the handler is installed (a handler may only write() and _exit()).
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr const char* kStopSignalNames[] = {"SIGINT", "SIGTERM", "SIGHUP"};
char g_rendezvous_stop_line[3][256];
size_t g_rendezvous_stop_length[3];

int StopSignalSlot(int signal_number) {
  return signal_number == SIGINT ? 0 : signal_number == SIGTERM ? 1 : 2;
}

// Async-signal-safe: write and _exit only.
void RendezvousStopHandler(int signal_number) {
  const int slot = StopSignalSlot(signal_number);
  const ssize_t written =
      write(STDERR_FILENO, g_rendezvous_stop_line[slot], g_rendezvous_stop_length[slot]);
  (void)written;
  _exit(128 + signal_number);
}

void InstallRendezvousStopHandlers(const collectives::RendezvousInfo& info) {
  for (int slot = 0; slot < 3; ++slot) {
    const std::string line = absl::StrCat(
        "pretrain: rank ", info.rank, ": stopped by ", kStopSignalNames[slot],
        " during the rendezvous at ", info.master_addr, ":", info.master_port,
        " (before training began: nothing to save); exit code ", 128 + kStopSignals[slot], "\n");
    g_rendezvous_stop_length[slot] = std::min(line.size(), sizeof(g_rendezvous_stop_line[slot]));
    std::memcpy(g_rendezvous_stop_line[slot], line.data(), g_rendezvous_stop_length[slot]);
  }
  struct sigaction action = {};
  action.sa_handler = RendezvousStopHandler;
  sigemptyset(&action.sa_mask);
  for (int signal_number : kStopSignals) sigaddset(&action.sa_mask, signal_number);
  for (int signal_number : kStopSignals) sigaction(signal_number, &action, nullptr);
}

// Under a launcher agent (torchrun's, or LaunchLocal's: both host the store and are this rank's
// parent), the agent's death is a stop request: without it the ranks would train on as orphans,
// unobserved, writing checkpoints nobody collects (reproduced by SIGKILLing torchrun). SIGTERM
// rather than SIGKILL, so the step in flight is saved. A parent that died before the prctl is
// caught by comparing it with the one the environment was inherited from.
void StopWhenTheLauncherDies(const collectives::RendezvousInfo& info, pid_t parent) {
  if (!info.agent_hosts_store) return;
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) raise(SIGTERM);
}

// One rank of a job whose environment `info` describes.
int RunRank(const TrainerConfig& config, const collectives::RendezvousInfo& info, pid_t parent) {
  InstallRendezvousStopHandlers(info);
  StopWhenTheLauncherDies(info, parent);
  auto comm = CreateCommunicator(config, info);
  if (!comm.ok()) return Fail(comm.status());
  InstallStopHandlers();  // from now on a signal is a graceful stop after a step
  TrainOptions options;
  options.stop_signal = &g_stop_signal;
  std::FILE* tty = nullptr;
  if (info.rank == 0) {
    const char* tty_env = std::getenv(kTtyEnv);
    if (tty_env != nullptr && std::string(tty_env) == "1") tty = std::fopen("/dev/tty", "w");
    options.terminal = tty != nullptr || IsTerminal(stdout);
    if (tty != nullptr) options.out = tty;
  }
  absl::StatusOr<TrainSummary> summary = Train(config, **comm, options);
  if (tty != nullptr) std::fclose(tty);
  if (!summary.ok()) return Fail(summary.status());
  if (info.rank == 0) std::printf("%s\n", summary->ToJson().c_str());
  std::fflush(stdout);
  return summary->stop_signal != 0 ? 128 + summary->stop_signal : 0;
}

// Relaunches this binary on `nprocs` local ranks; prints rank 0's JSON line last, unprefixed.
int LaunchSelf(int argc, char** argv, int nprocs) {
  collectives::LaunchOptions options;
  options.binary = "/proc/self/exe";
  for (int i = 1; i < argc; ++i) options.args.emplace_back(argv[i]);
  options.nprocs = nprocs;
  // When a rank dies, the others notice within seconds (a broken connection) or, when it hangs
  // without dying (SIGSTOP, a stuck device), within collectives::HangFailureBound of
  // --distributed_timeout_s; either way they fail naming it and exit. The grace period covers the
  // time a rank needs after that (its error path and exit), not the timeout again; a rank found
  // stopped once the others ended is killed without it (LaunchOptions::grace_period).
  options.grace_period = absl::Seconds(15);
  if (IsTerminal(stdout)) options.env.push_back({kTtyEnv, "1"});
  std::string json;
  options.output = [&json](absl::string_view line, bool is_stderr) {
    absl::string_view rest = line;
    if (!is_stderr && absl::ConsumePrefix(&rest, "[rank 0] {")) {
      json = absl::StrCat("{", rest);
      return;
    }
    std::fprintf(is_stderr ? stderr : stdout, "%.*s\n", static_cast<int>(line.size()),
                 line.data());
    std::fflush(is_stderr ? stderr : stdout);
  };
  absl::StatusOr<collectives::LaunchResult> result = collectives::LaunchLocal(options);
  // The ranks have ended: a late SIGINT/SIGTERM/SIGHUP (a scheduler repeating its request) must
  // neither change the job's exit code nor kill this process before its buffered JSON line is out.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGHUP, SIG_IGN);
  if (!result.ok()) {
    std::fprintf(stderr, "pretrain: launcher: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  // Rank 0's summary is printed after a graceful stop too (it has "stop_signal"); a failed rank 0
  // prints none.
  if (!json.empty()) std::printf("%s\n", json.c_str());
  std::fflush(stdout);
  // Every rank exiting 128 + the same stop signal (SIGINT, SIGTERM, SIGHUP: those the launcher
  // forwards) is a stop, after a step or during the rendezvous. Every rank dying of the same other
  // signal is a failure to report: SIGBUS in all of them is the token file they all map truncated.
  const int code = result->exit_code;
  const bool stop_signal = code == 128 + SIGINT || code == 128 + SIGTERM || code == 128 + SIGHUP;
  const bool stopped = stop_signal &&
                       std::all_of(result->rank_exit_codes.begin(), result->rank_exit_codes.end(),
                                   [&](int c) { return c == code; });
  if (!result->stopped_ranks.empty()) {
    std::fprintf(stderr, "pretrain: %s\n",
                 collectives::DescribeStopped(result->stopped_ranks).c_str());
  }
  if (code != 0 && !stopped) {
    std::fprintf(stderr, "pretrain: rank %d failed first with %s\n", result->first_failed_rank,
                 collectives::DescribeExitCode(code).c_str());
  }
  return result->exit_code;
}

// Why an explicit --nproc_per_node=`nproc` that differs from the launcher's count is refused.
absl::Status NprocPerNodeIgnored(int nproc, const collectives::RendezvousInfo& info) {
  const char* ask = info.source == "slurm" ? "srun --ntasks-per-node" : "torchrun --nproc-per-node";
  if (info.local_world_size_from.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nproc_per_node=", nproc, " is ignored under ", info.source, ", which starts the ranks (",
        info.world_size, " in all) without saying how many run on this node; ask the launcher for "
        "the ranks (", ask, ") or drop the flag"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--nproc_per_node=", nproc, " is ignored under ", info.source, ", which runs ",
      info.local_world_size, " rank(s) on this node (", info.local_world_size_from, "; ",
      info.world_size, " in all); ask the launcher for the ranks (", ask, ") or drop the flag"));
}

int Main(int argc, char** argv) {
  // First, so that every tensor of the run is counted (the summary's allocator_peak_bytes).
  InstallCountingCpuAllocator();
  absl::SetProgramUsageMessage(
      "trains a GPT on local ranks or under torchrun/SLURM.\n"
      "  pretrain [--flags]   (no flags: tiny model, synthetic corpus, 2 local CPU ranks)\n"
      "The last stdout line is a JSON summary. Exit codes: 0 ok, 2 bad input, 1 other failure.\n"
      "SIGINT, SIGTERM or SIGHUP: every rank finishes its step, saves it (with --save_dir) and\n"
      "exits 128 + the signal (130, 143, 129); --resume continues. A repeat after 2 s kills at\n"
      "once; during the rendezvous a rank exits at once. The death of the launcher (torchrun's\n"
      "agent) is a SIGTERM to its ranks.");
  std::set<std::string> given;
  absl::Status prescan = PrescanFlags(argc, argv, &given);
  if (!prescan.ok()) return Fail(prescan);
  absl::ParseCommandLine(argc, argv);  // handles --help; values were checked above
  absl::StatusOr<TrainerConfig> config = MakeConfig(given);
  if (!config.ok()) return Fail(config.status());

  const pid_t parent = getppid();
  absl::StatusOr<collectives::RendezvousInfo> info =
      collectives::ParseRendezvous(collectives::ProcessEnvironment());
  const MachineResources machine = ProbeMachine();
  // Every process decides alike, before any rank writes: a first start or a restart.
  ResolveResumeAuto(&*config);
  if (info.ok()) {
    // Under a launcher the launcher decides the ranks: an explicit --nproc_per_node that disagrees
    // with it (say 2 under a one-task SLURM allocation) would otherwise be silently ignored.
    if (given.count("nproc_per_node") != 0 &&
        absl::GetFlag(FLAGS_nproc_per_node) != info->local_world_size) {
      return Fail(NprocPerNodeIgnored(absl::GetFlag(FLAGS_nproc_per_node), *info));
    }
    if (absl::Status s = ValidateTrainerConfig(*config, info->world_size); !s.ok()) return Fail(s);
    if (absl::Status s = CheckResolvedModel(*config); !s.ok()) return Fail(s);
    if (absl::Status s = CheckRouting(*config); !s.ok()) return Fail(s);
    if (absl::Status s = CheckDevice(*config, info->local_rank + 1); !s.ok()) return Fail(s);
    if (absl::Status s = CheckMachine(*config, info->local_world_size, info->world_size, machine);
        !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s = CheckLogDir(*config); !s.ok()) return Fail(s);
    return RunRank(*config, *info, parent);
  }
  if (info.status().code() != absl::StatusCode::kNotFound) return Fail(info.status());

  // Not under a launcher: check everything that needs no ranks before starting any.
  const int nprocs = absl::GetFlag(FLAGS_nproc_per_node);
  if (nprocs < 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--nproc_per_node must be >= 1, got ", nprocs)));
  }
  if (absl::Status s = ValidateTrainerConfig(*config, nprocs); !s.ok()) return Fail(s);
  if (absl::Status s = CheckResolvedModel(*config); !s.ok()) return Fail(s);
  if (absl::Status s = CheckRouting(*config); !s.ok()) return Fail(s);
  if (absl::Status s = CheckDevice(*config, nprocs); !s.ok()) return Fail(s);
  if (absl::Status s = CheckMachine(*config, nprocs, nprocs, machine); !s.ok()) return Fail(s);
  if (absl::Status s = CheckLogDir(*config); !s.ok()) return Fail(s);
  if (absl::Status s = CheckSaveDir(*config); !s.ok()) return Fail(s);
  if (Resuming(*config)) {
    // The checkpoint's pointer and manifest (its CRC), once here rather than on every rank.
    if (!std::filesystem::exists(config->save_dir + "/latest")) {
      return Fail(absl::NotFoundError(absl::StrCat("--resume: no checkpoint in --save_dir: '",
                                                   config->save_dir, "/latest' does not exist")));
    }
    absl::StatusOr<std::string> latest = checkpoint::ResolveLatest(config->save_dir);
    absl::Status readable = latest.status();
    if (latest.ok()) readable = checkpoint::ReadManifest(*latest).status();
    if (!readable.ok()) {
      return Fail(absl::Status(readable.code(), absl::StrCat("--resume: ", readable.message())));
    }
  }
  // The data as the ranks will load it (mapped, so this costs a read of each file, not a copy).
  absl::StatusOr<TrainingData> data = LoadTrainingData(*config);
  if (!data.ok()) return Fail(data.status());
  if (config->sample_order == SampleOrder::kDocuments) {
    // The documents a shuffled-documents order needs, before any rank starts (one scan for EOD).
    if (absl::Status s = data::DocumentEnds(*data->train, data->eod_token).status(); !s.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--sample_order=documents: ", s.message())));
    }
  }
  if (!config->save_dir.empty()) {
    // Last, as it creates --save_dir: fail before launching when another run holds it (rank 0
    // takes the lock for the run).
    absl::StatusOr<checkpoint::RootLock> lock =
        checkpoint::LockRoot(config->save_dir, "pretrain, checking before it launches");
    if (!lock.ok()) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("--save_dir: ", lock.status().message())));
    }
  }
  return LaunchSelf(argc, argv, nprocs);
}

}  // namespace
}  // namespace orthoshard::integration

int main(int argc, char** argv) { return orthoshard::integration::Main(argc, argv); }
