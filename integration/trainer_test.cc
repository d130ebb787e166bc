// Train() in-process on a single Gloo rank: the device check against the communicator, and a short
// run on the communicator's device (the CPU here; the same code path puts everything on the GPU
// under an NCCL communicator).
#include "integration/trainer.h"

#include <cmath>
#include <cstdio>
#include <memory>

#include "collectives/gloo_communicator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<collectives::Communicator> SingleRank() {
  collectives::GlooOptions options;
  options.rank = 0;
  options.size = 1;
  options.master_port = 0;  // the hosted store picks a free port
  options.host_store = true;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> comm =
      collectives::CreateGlooCommunicator(options);
  EXPECT_OK(comm.status());
  return comm.ok() ? std::move(*comm) : nullptr;
}

TrainOptions Quiet() {
  TrainOptions options;
  options.out = std::tmpfile();
  options.err = options.out;
  return options;
}

TEST(Train, DeviceMustMatchTheCommunicator) {
  std::unique_ptr<collectives::Communicator> comm = SingleRank();
  ASSERT_NE(comm, nullptr);
  TrainerConfig config;
  config.device = "cuda";
  config.steps = 2;
  TrainOptions options = Quiet();
  EXPECT_THAT(Train(config, *comm, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--device=cuda: the gloo communicator reduces on cpu, expected a "
                                 "CUDA device (NCCL)")));
  std::fclose(options.out);
}

TEST(Train, RunsOnTheCommunicatorsDevice) {
  std::unique_ptr<collectives::Communicator> comm = SingleRank();
  ASSERT_NE(comm, nullptr);
  TrainerConfig config;
  config.device = "cpu";
  config.steps = 30;
  config.global_batch = 8;
  config.num_threads = 1;
  TrainOptions options = Quiet();
  absl::StatusOr<TrainSummary> summary = Train(config, *comm, options);
  std::fclose(options.out);
  ASSERT_OK(summary.status());
  EXPECT_EQ(summary->steps, 30);
  EXPECT_EQ(summary->world_size, 1);
  EXPECT_TRUE(std::isfinite(summary->final_loss));
  EXPECT_LT(summary->final_loss, 0.8 * summary->initial_loss);
  EXPECT_LT(summary->eval_loss, summary->initial_eval_loss);
}

}  // namespace
}  // namespace orthoshard::integration
