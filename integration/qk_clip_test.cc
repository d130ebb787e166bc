// QK-clip through the real distributed set-up (integration::Build) on 2 Gloo ranks, in every --dist
// mode: after one step whose learning rates are too small to move any fp32 weight (1e-30: an
// update below half an ulp of every param leaves it as it was, and the decay factor 1 - 1e-32 is
// 1), the step's own batch, measured again, has each clipped KV group's largest logit at tau and
// every other group's logits unchanged. So the factors reached the updated weights on the rank that
// owns them (Muon's layer-wise owner, each ZeRO-1 AdamW range, every replicated rank) and the param
// sync carried them to every rank. (That 1 and 2 ranks in each mode end at the same params with a
// normal learning rate is pretrain_test's QkClipIsTheSameAtAnyRankCountAndMode.)
#include "integration/qk_clip.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "data/loader.h"
#include "gtest/gtest.h"
#include "integration/setup.h"
#include "model/model.h"

namespace orthoshard::integration {
namespace {

using collectives::Communicator;

at::Tensor Ids(const std::vector<int64_t>& ids, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(ids.data()), {rows, cols}, at::kLong).clone();
}

// The largest logit of every block and head over `batches` on every rank: [L, H].
at::Tensor Measure(Setup& s, Communicator& comm, const std::vector<data::MicroBatch>& batches) {
  const model::GptConfig& c = s.model->config();
  at::Tensor record = at::full({c.num_layers, c.num_heads},
                               -std::numeric_limits<float>::infinity(), at::kFloat);
  s.model->set_max_logit_record(record);
  at::NoGradGuard no_grad;
  for (const data::MicroBatch& b : batches) {
    EXPECT_OK(s.model->Loss(Ids(b.inputs, b.rows, b.cols), Ids(b.targets, b.rows, b.cols))
                  .status());
  }
  s.model->set_max_logit_record(at::Tensor());
  EXPECT_OK(s.ddp->TakeHookError());
  auto work = comm.AllReduce(record, {collectives::ReduceOp::kMax});
  EXPECT_OK(work.status());
  if (work.ok()) EXPECT_OK((*work)->Wait(comm.timeout()));
  return record;
}

// One training step with QK-clip, as the trainer's RunStep runs it.
QkClipStats Step(Setup& s, Communicator& comm, QkClip& clip,
                 const std::vector<data::MicroBatch>& batches) {
  s.ddp->ZeroGradBuffers();
  clip.BeginStep();
  for (size_t m = 0; m < batches.size(); ++m) {
    const data::MicroBatch& b = batches[m];
    s.ddp->set_is_last_microbatch(m + 1 == batches.size());
    absl::StatusOr<at::Tensor> loss =
        s.model->Loss(Ids(b.inputs, b.rows, b.cols), Ids(b.targets, b.rows, b.cols));
    EXPECT_OK(loss.status());
    if (loss.ok()) loss->mul(1.0 / static_cast<double>(batches.size())).backward();
  }
  EXPECT_OK(s.ddp->FinishGradSync());
  at::NoGradGuard no_grad;
  absl::StatusOr<QkClipStats> stats = clip.Prepare(comm, *s.optimizer);
  EXPECT_OK(stats.status());
  EXPECT_OK(s.optimizer->Step().status());
  EXPECT_OK(s.ddp->FinishParamSync());
  return stats.ok() ? *stats : QkClipStats{};
}

// For the config (any tau > 0 turns QK-clip on); the test's own tau splits block 0's groups.
constexpr double kConfigTau = 0.06;

// The measured logit of a clipped group of block 0 against tau. Its input (the embedding) and
// weights are the same but for the factor sqrt(tau / S) on q's and k's rows (each rounded within
// 2^-24), so in exact arithmetic its largest logit is tau; the two fp32 measurements round within
// (3C + D + 19) u A each (model/qk_clip_test.cc derives it; A is the logit with every product in
// absolute value), 2.0e-5 A for tiny's C = 64, D = 16. 2e-4 tau admits A up to 10 S.
constexpr double kRelativeTolerance = 2e-4;
// A later block's input has changed too: the earlier blocks' attention now follows clipped
// logits. Its largest logit is tau times that change, which stays within 1% here (under 0.1% seen).
constexpr double kLaterBlockTolerance = 1e-2;

void ExpectClipped(const TrainerConfig& config, Communicator& comm) {
  at::set_num_threads(1);
  ASSERT_OK_AND_ASSIGN(Setup s, Build(config, comm));
  const std::vector<data::MicroBatch> batches = s.train->Next();
  const at::Tensor before = Measure(s, comm, batches);
  const model::GptConfig& c = s.model->config();
  const int64_t R = c.num_heads / c.num_kv_heads;
  // Halfway between block 0's smallest and largest group maximum: some of its groups clip, some
  // not.
  const at::Tensor groups0 = before[0].view({c.num_kv_heads, R}).amax(1);
  const double tau = 0.5 * (groups0.min().item<double>() + groups0.max().item<double>());
  QkClip clip(tau, s.model.get());
  const QkClipStats stats = Step(s, comm, clip, batches);
  const at::Tensor after = Measure(s, comm, batches);
  EXPECT_DOUBLE_EQ(stats.max_logit, before.max().item<double>());
  int64_t clipped = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t g = 0; g < c.num_kv_heads; ++g) {
      const at::Tensor b = before[l].narrow(0, g * R, R), a = after[l].narrow(0, g * R, R);
      const double s_before = b.max().item<double>(), s_after = a.max().item<double>();
      const double tolerance = l == 0 ? kRelativeTolerance : kLaterBlockTolerance;
      if (s_before > tau) {
        ++clipped;
        EXPECT_NEAR(s_after, tau, tolerance * tau) << "block " << l << " group " << g;
      } else if (l == 0) {
        EXPECT_TRUE(at::equal(a, b)) << "block 0 group " << g << " was not clipped";
      }
    }
  }
  EXPECT_EQ(stats.clipped_groups, clipped);
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, c.num_layers * c.num_kv_heads);
  EXPECT_LE(after[0].max().item<double>(), tau * (1 + kRelativeTolerance));
  std::printf("rank %d, --dist=%s --optimizer=%s: %lld of %lld groups clipped, max logit %.6g -> "
              "%.6g in block 0, %.6g -> %.6g in all (tau %g)\n",
              comm.rank(), ChoiceName(config.dist), ChoiceName(config.optimizer),
              static_cast<long long>(clipped), static_cast<long long>(c.num_layers * c.num_kv_heads),
              before[0].max().item<double>(), after[0].max().item<double>(),
              before.max().item<double>(), after.max().item<double>(), tau);
}

TrainerConfig StillConfig(DistMode dist, OptimizerChoice optimizer) {
  TrainerConfig c;
  c.model = "tiny";
  c.steps = 2;
  c.global_batch = 8;
  c.warmup_steps = 0;
  c.schedule = optimizers::ScheduleKind::kConstant;
  c.lr = 1e-30;
  c.muon_lr = 1e-30;
  c.max_grad_norm = 0;
  c.dist = dist;
  c.optimizer = optimizer;
  c.qk_clip_threshold = kConfigTau;
  return c;
}

struct Mode {
  DistMode dist;
  OptimizerChoice optimizer;
};

class QkClipOnRanks : public ::testing::TestWithParam<Mode> {};

TEST_P(QkClipOnRanks, ClipsTheStepsOwnBatchToTau) {
  const TrainerConfig config = StillConfig(GetParam().dist, GetParam().optimizer);
  ASSERT_OK(ValidateTrainerConfig(config, 2));
  collectives::testing::RunOnRanks(2, [&](Communicator& comm) { ExpectClipped(config, comm); });
}

INSTANTIATE_TEST_SUITE_P(
    EveryDistMode, QkClipOnRanks,
    ::testing::Values(Mode{DistMode::kReplicated, OptimizerChoice::kMuon},
                      Mode{DistMode::kLayerwise, OptimizerChoice::kMuon},
                      Mode{DistMode::kFsdp, OptimizerChoice::kMuon},
                      Mode{DistMode::kDistOpt, OptimizerChoice::kAdamW},
                      Mode{DistMode::kLayerwise, OptimizerChoice::kAdamW}),
    [](const ::testing::TestParamInfo<Mode>& info) {
      return std::string(ChoiceName(info.param.dist)) + "_" + ChoiceName(info.param.optimizer);
    });

}  // namespace
}  // namespace orthoshard::integration
