// One rank of distributed_checkpoint_test, started by LaunchLocal:
//   ckpt_worker SCENARIO ROOT STEPS [OLD_DP]
// Trains optimizers/distributed's test model with the sharded DistributedChainedOptimizer on
// deterministic per-rank gradients and checks against the single-process reference trajectory:
//   save      STEPS steps, then SaveDistributedCheckpoint(ROOT, step STEPS)
//   resume    load ROOT's latest (saved at OLD_DP after STEPS steps): params bitwise equal to the
//             reference after STEPS steps at OLD_DP, then STEPS more steps at this dp bitwise equal
//             to the reference's continued trajectory
//   crash     STEPS steps, save (committed), one more step, save again with rank 1 SIGKILLing
//             itself after writing its shard (never returns on rank 1)
//   async_save STEPS steps, AsyncCheckpointSaver::Start (step STEPS), one more step while the
//             write runs, Start (step STEPS+1, finalizing the first), Finalize
//   async_fail save at STEPS; async save of STEPS+1 fails on rank 1; the next Start reports it
//             (kUnavailable on rank 1, kAborted elsewhere) and starts nothing
//   corrupt   loading ROOT must fail; prints "LOADERR <status>" and checks nothing changed
// Prints "PASS <scenario> rank <r>" on success; exits 1 with the difference otherwise.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ops/equal.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/distributed_checkpoint.h"
#include "collectives/gloo_communicator.h"
#include "common/status_macros.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/distributed/testing/test_model.h"

namespace orthoshard::checkpoint::testing {
namespace {

namespace od = optimizers::distributed;
namespace odt = optimizers::distributed::testing;

constexpr int kBucketSize = 300;

struct Options {
  std::string scenario;
  std::string root;
  int steps = 0;
  int old_dp = 0;
};

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

absl::Status CompareBitwise(const std::vector<layout::ParamSpec>& specs,
                            const std::vector<at::Tensor>& got,
                            const std::vector<at::Tensor>& want, const std::string& when) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!at::equal(got[i], want[i])) {
      const double diff =
          got[i].to(at::kFloat).sub(want[i].to(at::kFloat)).abs().max().item().toDouble();
      return absl::InternalError(absl::StrCat(when, ": param '", specs[i].name,
                                              "' differs from the reference (max |diff| ", diff,
                                              ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status TrainStep(collectives::Communicator& comm, const std::vector<layout::ParamSpec>& specs,
                       odt::DistributedModel& model, od::DistributedChainedOptimizer& opt,
                       int step) {
  odt::FillRankGrads(specs, model, comm.rank(), step);
  ASSIGN_OR_RETURN(auto works, buffers::LaunchGradSync(comm, model.buffers,
                                                      buffers::GradSync::kReduceScatter,
                                                      collectives::ReduceOp::kAvg));
  RETURN_IF_ERROR(buffers::WaitAll(works, comm.timeout()));
  return opt.StepAndSync().status();
}

SharedState Shared(int64_t step) {
  SharedState s;
  s.step = step;
  s.data_position = std::string("pos\0\xff", 5) + std::to_string(step);
  s.rng_seed = 1234 + step;
  s.model_config = "small_model(2)";
  s.optimizer_config = "test_config";
  return s;
}

absl::Status Run(const Options& o, collectives::Communicator& comm) {
  const int dp = comm.size();
  const std::vector<layout::ParamSpec> specs = odt::SmallModel(2);
  const optimizers::ChainedConfig config = odt::TestConfig(0.0);
  ASSIGN_OR_RETURN(odt::DistributedModel model,
                   odt::BuildDistributedModel(specs, dp, layout::Strategy::kLayerwise,
                                              kBucketSize));
  ASSIGN_OR_RETURN(auto opt, od::DistributedChainedOptimizer::Create(
                                 model.buffers, &comm, config, od::DistributedMode::kSharded));
  ASSIGN_OR_RETURN(auto ref, odt::Reference::Create(specs, config));
  const std::string& s = o.scenario;

  if (s == "save" || s == "crash") {
    for (int step = 0; step < o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step));
    }
    RETURN_IF_ERROR(SaveDistributedCheckpoint(o.root, Shared(o.steps), model.buffers, *opt, comm));
    if (s == "crash") {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps));
      SaveOptions save;
      if (comm.rank() == 1) save.after_shard_written = [] {
          std::raise(SIGKILL);
          return absl::OkStatus();
        };
      RETURN_IF_ERROR(
          SaveDistributedCheckpoint(o.root, Shared(o.steps + 1), model.buffers, *opt, comm, save));
      return absl::InternalError("the save with a killed rank returned OK");
    }
    return absl::OkStatus();
  }
  if (s == "async_save") {
    // Save at STEPS asynchronously while the next step runs (it changes params and state after
    // the snapshot), then at STEPS + 1; the resume scenario then checks step STEPS + 1 is latest
    // and the step-STEPS directory holds the pre-step values (loaded by "resume_at").
    AsyncCheckpointSaver saver(&comm);
    for (int step = 0; step < o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step));
    }
    RETURN_IF_ERROR(Check(!saver.write_finished(), "write_finished before any Start"));
    RETURN_IF_ERROR(saver.Start(o.root, Shared(o.steps), model.buffers, *opt));
    RETURN_IF_ERROR(Check(saver.in_flight(), "no save in flight after Start"));
    RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps));
    RETURN_IF_ERROR(saver.Start(o.root, Shared(o.steps + 1), model.buffers, *opt));  // finalizes
    // write_finished() turns true once this rank's write ends, without blocking; Finalize resets it.
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (!saver.write_finished() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    RETURN_IF_ERROR(Check(saver.write_finished(), "the write did not finish within 60 s"));
    RETURN_IF_ERROR(saver.Finalize());
    return Check(!saver.write_finished() && !saver.in_flight(), "still in flight after Finalize");
  }
  if (s == "async_fail") {
    // Step STEPS committed synchronously; the async save of STEPS + 1 fails on rank 1 (injected
    // after its write); the next Start reports it on every rank and commits nothing.
    for (int step = 0; step < o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step));
    }
    RETURN_IF_ERROR(SaveDistributedCheckpoint(o.root, Shared(o.steps), model.buffers, *opt, comm));
    RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps));
    AsyncCheckpointSaver saver(&comm);
    SaveOptions failing;
    if (comm.rank() == 1) {
      failing.after_shard_written = [] { return absl::UnavailableError("injected write failure"); };
    }
    RETURN_IF_ERROR(saver.Start(o.root, Shared(o.steps + 1), model.buffers, *opt, failing));
    RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, o.steps + 1));
    const absl::Status next = saver.Start(o.root, Shared(o.steps + 2), model.buffers, *opt);
    const absl::StatusCode want =
        comm.rank() == 1 ? absl::StatusCode::kUnavailable : absl::StatusCode::kAborted;
    RETURN_IF_ERROR(Check(next.code() == want, "next Start returned " + next.ToString()));
    RETURN_IF_ERROR(Check(!saver.in_flight(), "a save started after a failed one"));
    return saver.Finalize();
  }
  if (s == "corrupt") {
    std::vector<at::Tensor> before;
    for (const at::Tensor& p : model.params) before.push_back(p.clone());
    absl::StatusOr<SharedState> loaded = LoadDistributedCheckpoint(o.root, model.buffers, *opt, comm);
    RETURN_IF_ERROR(Check(!loaded.ok(), "loading a corrupted checkpoint succeeded"));
    std::printf("LOADERR %s\n", loaded.status().ToString().c_str());
    RETURN_IF_ERROR(Check(opt->steps_taken() == 0, "optimizer state changed by a failed load"));
    return CompareBitwise(specs, model.params, before, "after a failed load");
  }
  if (s == "resume") {
    ASSIGN_OR_RETURN(SharedState got, LoadDistributedCheckpoint(o.root, model.buffers, *opt, comm));
    const SharedState want = Shared(o.steps);
    RETURN_IF_ERROR(Check(got.step == want.step && got.data_position == want.data_position &&
                              got.rng_seed == want.rng_seed &&
                              got.model_config == want.model_config &&
                              got.optimizer_config == want.optimizer_config,
                          "shared state differs"));
    RETURN_IF_ERROR(Check(opt->steps_taken() == o.steps, "optimizer step count not restored"));
    for (int step = 0; step < o.steps; ++step) RETURN_IF_ERROR(ref->Step(o.old_dp, step).status());
    RETURN_IF_ERROR(CompareBitwise(specs, model.params, ref->params(), "after load"));
    for (int step = o.steps; step < 2 * o.steps; ++step) {
      RETURN_IF_ERROR(TrainStep(comm, specs, model, *opt, step));
      RETURN_IF_ERROR(ref->Step(dp, step).status());
      RETURN_IF_ERROR(
          CompareBitwise(specs, model.params, ref->params(), absl::StrCat("step ", step)));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown scenario " + s);
}

}  // namespace
}  // namespace orthoshard::checkpoint::testing

int main(int argc, char** argv) {
  using namespace orthoshard;
  checkpoint::testing::Options options;
  if (argc < 4 || !absl::SimpleAtoi(argv[3], &options.steps) ||
      (argc == 5 && !absl::SimpleAtoi(argv[4], &options.old_dp))) {
    std::fprintf(stderr, "usage: %s SCENARIO ROOT STEPS [OLD_DP]\n", argv[0]);
    return 2;
  }
  options.scenario = argv[1];
  options.root = argv[2];
  auto comm = collectives::JoinGlooFromEnvironment(absl::Seconds(60), absl::Seconds(60));
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const absl::Status status = checkpoint::testing::Run(options, **comm);
  if (!status.ok()) {
    std::printf("FAIL %s rank %d: %s\n", argv[1], (*comm)->rank(), status.ToString().c_str());
    std::fflush(stdout);
    std::_Exit(1);
  }
  std::printf("PASS %s rank %d\n", argv[1], (*comm)->rank());
  std::fflush(stdout);
  std::_Exit(0);
}
