// CheckMachine, MinBytesPerRank and CheckLogDir (integration/preflight.h), on made-up machines.
#include "integration/preflight.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/config/trainer_config.h"
#include "model/gpt_config.h"

namespace orthoshard::integration {

using ::orthoshard::model::GptPreset;
using ::orthoshard::model::GptParamCount;
using ::orthoshard::model::GptHiddenMatrixCount;
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(Preflight, ThreadsBeyondTheCoresAreRefused) {
  TrainerConfig c;
  c.num_threads = 100000;
  MachineResources m{2, 16 * kGiB};
  EXPECT_THAT(CheckMachine(c, 2, 2, m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--num_threads 100000 exceeds the 2 cores this process may use")));
  c.num_threads = 2;
  EXPECT_OK(CheckMachine(c, 2, 2, m));
}

// The defaults fit a small machine; a global batch, eval batch count or synthetic corpus that
// cannot fit is refused before launch, naming the part and the flag.
TEST(Preflight, RunsThatCannotFitInMemoryAreRefused) {
  const MachineResources m{2, 20 * kGiB};
  TrainerConfig c;
  EXPECT_OK(CheckMachine(c, 2, 2, m));
  EXPECT_LT(MinBytesPerRank(c, 2), kGiB / 8);

  TrainerConfig huge_batch = c;
  huge_batch.global_batch = 1 << 26;  // 2^25 samples of 64 x 256 logits per rank
  EXPECT_THAT(CheckMachine(huge_batch, 2, 2, m),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("per rank x 2 rank(s) here"),
                             HasSubstr("the logits of a micro-batch of 33554432 samples (lower "
                                       "--global_batch or raise --micro_batches)"))));
  TrainerConfig evals = c;
  evals.eval_batches = int64_t{1} << 30;
  EXPECT_THAT(CheckMachine(evals, 2, 2, m),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the eval batches (lower --eval_batches, now 1073741824)")));
  TrainerConfig data = c;
  data.data = "synthetic:100000000000";
  EXPECT_THAT(CheckMachine(data, 2, 2, m),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the data (--data=synthetic:100000000000)")));
  // Unknown memory: not checked.
  EXPECT_OK(CheckMachine(data, 2, 2, MachineResources{2, 0}));
}

// The activation term is what a block's backward certainly reads per token (4 C + (H + 2 KV) D +
// 3 F) in every block, or with --recompute=full each block's input C and one block's worth:
// TinyLlama-1.1B (C 2048, 32 heads and 4 KV heads of D 64, F 5632, 22 blocks) at 2048 tokens per
// rank on 2 fsdp ranks keeps at least 22 x 27648 x 2048 x 4 bytes = 4.6 GiB of activations and
// needs 23 GiB for the two ranks without recompute, more than a 21 GiB machine has; with full
// recompute 14.9 GiB.
TEST(Preflight, TheActivationTermFollowsRecompute) {
  TrainerConfig c;
  c.model = "tinyllama-1.1b";
  c.dist = DistMode::kFsdp;
  c.global_batch = 2;
  c.seq_len = 2048;
  c.eval_batches = 1;
  c.data = "synthetic:100000";
  const int64_t C = 2048, block = 4 * C + (32 + 2 * 4) * 64 + 3 * 5632, tokens = 2048;
  const MachineResources m{2, 21 * kGiB};
  EXPECT_THAT(CheckMachine(c, 2, 2, m),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("the largest part is the model"),
                             HasSubstr("the next is the activations of a micro-batch of 1 x 2048 "
                                       "tokens (--recompute=none; --recompute=full keeps only "
                                       "each block's input)"))));
  TrainerConfig full = c;
  full.recompute = RecomputeMode::kFull;
  EXPECT_OK(CheckMachine(full, 2, 2, m));
  EXPECT_EQ(MinBytesPerRank(c, 2) - MinBytesPerRank(full, 2),
            (22 * block - (22 * C + block)) * tokens * 4);
  // The first 11 blocks recomputed: their inputs, the other 11 blocks' activations, and one
  // recomputed block's during its backward.
  TrainerConfig half = full;
  half.recompute_layers = 11;
  EXPECT_EQ(MinBytesPerRank(c, 2) - MinBytesPerRank(half, 2), (11 * block - (11 * C + block)) * tokens * 4);
  // selective: the same lower bound as none; bf16 activations: half the bytes.
  TrainerConfig selective = c;
  selective.recompute = RecomputeMode::kSelective;
  EXPECT_EQ(MinBytesPerRank(selective, 2), MinBytesPerRank(c, 2));
  TrainerConfig bf16 = full;
  bf16.precision = Precision::kBf16;
  TrainerConfig bf16_none = c;
  bf16_none.precision = Precision::kBf16;
  EXPECT_EQ(MinBytesPerRank(bf16_none, 2) - MinBytesPerRank(bf16, 2),
            (22 * block - (22 * C + block)) * tokens * 2);
}

// The model term counts what the model really has (GptParamCount is checked against the built
// model in model_test); the gpt2-124m preset's fp32 params and grads alone are ~1 GiB.
TEST(Preflight, TheModelTermScalesWithThePreset) {
  TrainerConfig c;
  c.model = "gpt2-124m";
  c.global_batch = 2;
  c.data = "synthetic:1000";
  const int64_t params = GptParamCount(*GptPreset("gpt2-124m"));
  EXPECT_GT(params, 100'000'000);
  EXPECT_GE(MinBytesPerRank(c, 2), params * 8);
  EXPECT_THAT(CheckMachine(c, 2, 2, MachineResources{2, kGiB}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the model (--model=gpt2-124m")));
}

// The model term follows what --dist keeps on a rank: TinyLlama-1.1B with AdamW (8 bytes of state
// per param) on 2 ranks needs 16 bytes per param on a replicated rank, 4 + 4 + 8 / 2 = 12 on a
// layerwise one (26 GB for the two: more than a 24 GB machine has) and (4 + 4 + 8) / 2 = 8 on an
// fsdp one, which fits.
TEST(Preflight, TheModelTermFollowsWhatTheDistModeKeepsPerRank) {
  TrainerConfig c;
  c.model = "tinyllama-1.1b";
  c.optimizer = OptimizerChoice::kAdamW;
  c.global_batch = 2;
  c.seq_len = 64;
  c.eval_batches = 1;
  c.data = "synthetic:100000";
  const int64_t params = GptParamCount(*GptPreset(c.model));
  // Logits, activations (at 64 tokens 22 x 27648 x 64 x 4 bytes: 0.14 byte per param), eval
  // batches and data: under 0.2 byte per param.
  const int64_t rest = [&] {
    TrainerConfig tiny = c;
    tiny.model = "tiny";
    tiny.dist = DistMode::kFsdp;
    return MinBytesPerRank(tiny, 2);
  }();
  const MachineResources machine{2, 24 * kGiB};
  c.dist = DistMode::kReplicated;
  EXPECT_GE(MinBytesPerRank(c, 2), 16 * params);
  c.dist = DistMode::kLayerwise;
  EXPECT_GE(MinBytesPerRank(c, 2), 12 * params);
  EXPECT_LT(MinBytesPerRank(c, 2), 12 * params + params / 5);
  EXPECT_THAT(CheckMachine(c, 2, 2, machine),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the model (--model=tinyllama-1.1b, 1100048384 params, "
                                 "--dist=layerwise: params and grads, its shard of the state)")));
  c.dist = DistMode::kFsdp;
  EXPECT_GE(MinBytesPerRank(c, 2), 8 * params);
  EXPECT_LT(MinBytesPerRank(c, 2), 8 * params + params / 5 + rest);
  EXPECT_OK(CheckMachine(c, 2, 2, machine));
  // Muon's momentum is 4 bytes per hidden-matrix element, AdamW's moments 8 for the rest.
  c.optimizer = OptimizerChoice::kMuon;
  const int64_t muon = GptHiddenMatrixCount(*GptPreset(c.model));
  EXPECT_GE(MinBytesPerRank(c, 2), (8 * params + 8 * (params - muon) + 4 * muon) / 2);
}

TEST(Preflight, ProbeReadsThisMachine) {
  const MachineResources m = ProbeMachine();
  EXPECT_GE(m.cores, 1);
  EXPECT_GT(m.available_bytes, 0);
}

TEST(Preflight, LogDirMustBeWritable) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  TrainerConfig c;
  EXPECT_OK(CheckLogDir(c));
  c.log_dir = tmp + "/new/tb";
  EXPECT_OK(CheckLogDir(c));
  std::ofstream(tmp + "/file") << "x";
  c.log_dir = tmp + "/file/tb";
  EXPECT_THAT(CheckLogDir(c), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr(tmp + "/file' is not a directory")));
  if (geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directories(tmp + "/ro");
    chmod((tmp + "/ro").c_str(), 0555);
    c.log_dir = tmp + "/ro/tb";
    EXPECT_THAT(CheckLogDir(c),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cannot write in")));
  }
}

}  // namespace
}  // namespace orthoshard::integration
