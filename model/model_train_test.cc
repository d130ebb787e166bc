// Proof that the model learns: Adam on the synthetic corpus takes the held-out loss far below the
// unigram entropy. Kept apart from model_test because it trains for a few seconds.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros_like.h>

#include "common/testing/status_matchers.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace orthoshard::model {

using ::orthoshard::data::TokenDataset;
using ::orthoshard::data::SyntheticCorpus;
using ::orthoshard::data::MakeSyntheticCorpus;
using ::orthoshard::data::LoaderOptions;
using ::orthoshard::data::MicroBatch;
using ::orthoshard::data::DataLoader;
namespace {

at::Tensor ToTensor(const std::vector<int64_t>& ids, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(ids.data()), {rows, cols},
                       at::TensorOptions().dtype(at::kLong))
      .clone();
}

// A few hundred Adam steps on the synthetic corpus take the held-out loss well below the unigram
// entropy, i.e. the model learns context, not just byte frequencies.
TEST(Gpt, AdamOnSyntheticCorpusLearns) {
  // One intra-op thread: on a shared 2-core machine OpenMP's spinning threads make a busy machine
  // several times slower (7 s vs 34 s measured here under load).
  at::set_num_threads(1);
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus corpus, MakeSyntheticCorpus({1, 300000}));
  ASSERT_OK_AND_ASSIGN(auto split, SplitTrainEval(corpus.data, 0.05, 1000));
  ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset("tiny"));
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(config, 5));
  LoaderOptions train_options;
  train_options.seq_len = config.max_seq_len;
  train_options.micro_batch_size = 16;
  ASSERT_OK_AND_ASSIGN(DataLoader train,
                       DataLoader::Create(std::make_shared<TokenDataset>(split.first), train_options));
  LoaderOptions eval_options = train_options;
  eval_options.shuffle = false;
  ASSERT_OK_AND_ASSIGN(DataLoader eval,
                       DataLoader::Create(std::make_shared<TokenDataset>(split.second), eval_options));
  auto eval_loss = [&] {
    at::NoGradGuard no_grad;
    double total = 0;
    for (int64_t s = 0; s < 4; ++s) {
      const MicroBatch b = eval.BatchAt(s)[0];
      total += model.Loss(ToTensor(b.inputs, b.rows, b.cols), ToTensor(b.targets, b.rows, b.cols))
                   .value()
                   .item<double>();
    }
    return total / 4;
  };
  // Learning thresholds below, not tolerances: each margin is far larger than what the CPU's
  // kernels change (avx512, avx2 and SSE4.1/default builds of ATen and oneDNN measured here).
  // An untrained model guesses bytes uniformly: initial 5.5744 vs log 256 = 5.5452.
  const double initial = eval_loss();
  EXPECT_NEAR(initial, std::log(256.0), 0.5);

  // Adam (Kingma & Ba 2015, Algorithm 1), lr 3e-3.
  const double lr = 3e-3, b1 = 0.9, b2 = 0.99, eps = 1e-8;
  std::vector<at::Tensor> m, v;
  for (const ModelParam& p : model.params()) {
    m.push_back(at::zeros_like(p.tensor));
    v.push_back(at::zeros_like(p.tensor));
  }
  for (int step = 1; step <= 300; ++step) {
    const MicroBatch b = train.Next()[0];
    ASSERT_OK_AND_ASSIGN(at::Tensor loss, model.Loss(ToTensor(b.inputs, b.rows, b.cols),
                                                     ToTensor(b.targets, b.rows, b.cols)));
    loss.backward();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < model.params().size(); ++i) {
      at::Tensor p = model.params()[i].tensor;
      const at::Tensor g = p.grad();
      m[i].mul_(b1).add_(g, 1 - b1);
      v[i].mul_(b2).addcmul_(g, g, 1 - b2);
      const at::Tensor denom = (v[i] / (1 - std::pow(b2, step))).sqrt_().add_(eps);
      p.addcdiv_(m[i], denom, -lr / (1 - std::pow(b1, step)));
      p.mutable_grad().reset();
    }
  }
  const double final_loss = eval_loss();
  std::printf("eval loss %.4f -> %.4f; unigram entropy %.4f; corpus entropy rate %.4f nats\n",
              initial, final_loss, corpus.unigram_entropy_nats, corpus.entropy_nats_per_token);
  // Measured final 0.459 .. 0.462 across those kernels: 2.5x below 0.35 * 3.330 = 1.166.
  EXPECT_LT(final_loss, 0.35 * corpus.unigram_entropy_nats);
  // Sanity of the corpus's documented entropy rate: no model beats it by much on held-out text
  // (0.46 vs 0.8 * 0.3023 = 0.242).
  EXPECT_GT(final_loss, 0.8 * corpus.entropy_nats_per_token);
}

}  // namespace
}  // namespace orthoshard::model
