// Activation recompute (recompute.h, Gpt::set_recompute): the same training step with and without
// it. Recompute runs the same ops on the same values (the forward once more, in backward), so
// every comparison here is bitwise (at::equal): losses, every param's gradient after two
// micro-batches, the MoE aux statistics and QK-clip's max-logit record.
#include "model/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/variable.h>

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace orthoshard::model {
namespace {

using collectives::Communicator;
using collectives::testing::RunOnRanks;
using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;
using Granularity = Gpt::RecomputeGranularity;

at::Tensor Ids(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, vocab, {b, t}, gen, at::kLong);
}

// Row 0 one document; row 1 documents starting at 0, 5 and 11.
Documents MakeDocuments(int64_t t) {
  at::Tensor segments = at::zeros({2, t}, at::kLong), positions = at::zeros({2, t}, at::kLong);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t doc = i < 5 ? 0 : i < 11 ? 1 : 2;
    segments[1][i] = doc;
    positions[1][i] = i - (doc == 0 ? 0 : doc == 1 ? 5 : 11);
    positions[0][i] = i;
  }
  return Documents{segments, positions};
}

// What one training step computed: each micro-batch's loss, every param's accumulated gradient,
// the last micro-batch's MoE aux values, and the max-logit record.
struct StepResult {
  std::vector<at::Tensor> losses;
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> aux;
  at::Tensor max_logits;
};

// Two micro-batches of 2 x T tokens through `model` (grads accumulated), the loss of each plus the
// MoE aux losses (load balance 0.01, z-loss 0.001 when `z_loss`; left out of the loss otherwise,
// so its gradient never arrives).
StepResult Step(Gpt& model, const Documents* documents, bool z_loss = true) {
  const GptConfig& c = model.config();
  StepResult result;
  for (const ModelParam& p : model.params()) p.tensor.mutable_grad() = at::Tensor();
  result.max_logits = at::full({c.num_layers, c.num_heads},
                               -std::numeric_limits<float>::infinity(), at::kFloat);
  model.set_max_logit_record(result.max_logits);
  for (int m = 0; m < 2; ++m) {
    const at::Tensor tokens = Ids(2, c.max_seq_len, c.vocab_size, 10 + m);
    const at::Tensor targets = Ids(2, c.max_seq_len, c.vocab_size, 20 + m);
    absl::StatusOr<at::Tensor> loss = model.Loss(tokens, targets, documents);
    EXPECT_OK(loss.status());
    if (!loss.ok()) return result;
    at::Tensor total = *loss;
    for (const MoeAux& a : model.moe_aux()) {
      total = total + 0.01 * a.load_balance;
      if (z_loss) total = total + 0.001 * a.z_loss;
    }
    total.backward();
    result.losses.push_back(total.detach());
  }
  for (const ModelParam& p : model.params()) result.grads.push_back(p.tensor.grad());
  for (const MoeAux& a : model.moe_aux()) {
    for (const at::Tensor& t : {a.load_balance, a.z_loss, a.tokens_per_expert, a.top_experts}) {
      result.aux.push_back(t.detach());
    }
  }
  return result;
}

void ExpectSame(const StepResult& a, const StepResult& b, const Gpt& model,
                const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t m = 0; m < a.losses.size(); ++m) {
    EXPECT_TRUE(at::equal(a.losses[m], b.losses[m]))
        << what << ": loss of micro-batch " << m << " " << a.losses[m].item<double>() << " vs "
        << b.losses[m].item<double>();
  }
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const std::string& name = model.params()[i].name;
    ASSERT_TRUE(a.grads[i].defined() && b.grads[i].defined()) << what << ": " << name;
    EXPECT_TRUE(at::equal(a.grads[i], b.grads[i])) << what << ": gradient of " << name;
  }
  ASSERT_EQ(a.aux.size(), b.aux.size()) << what << ": MoE aux entries (recorded once a forward)";
  for (size_t i = 0; i < a.aux.size(); ++i) {
    EXPECT_TRUE(at::equal(a.aux[i], b.aux[i])) << what << ": MoE aux value " << i;
  }
  EXPECT_TRUE(at::equal(a.max_logits, b.max_logits)) << what << ": max-logit record";
}

// Every granularity (and the first block only) against no recompute, on one model of `config`.
void CheckEveryGranularity(const GptConfig& config, at::ScalarType dtype, bool z_loss = true) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(config, 3, dtype));
  const Documents documents = MakeDocuments(config.max_seq_len);
  for (const Documents* docs : {static_cast<const Documents*>(nullptr), &documents}) {
    ASSERT_OK(model.set_recompute({}));
    const StepResult reference = Step(model, docs, z_loss);
    for (const Granularity g : {Granularity::kFull, Granularity::kSelective}) {
      for (const int layers : {-1, 1}) {
        ASSERT_OK(model.set_recompute({g, layers}));
        const std::string what = absl::StrCat(
            g == Granularity::kFull ? "full" : "selective", ", layers ", layers, ", ",
            c10::toString(dtype), docs != nullptr ? ", documents" : ", rows");
        ExpectSame(reference, Step(model, docs, z_loss), model, what);
      }
    }
  }
}

GptConfig DenseConfig() {
  GptConfig c;  // tiny's shape with grouped-query attention, 2 blocks
  c.num_kv_heads = 2;
  c.max_seq_len = 16;
  return c;
}

TEST(Recompute, DenseGptFp32IsBitwiseNoRecompute) {
  at::set_num_threads(1);
  CheckEveryGranularity(DenseConfig(), at::kFloat);
}

TEST(Recompute, DenseGptBf16IsBitwiseNoRecompute) {
  at::set_num_threads(1);
  CheckEveryGranularity(DenseConfig(), at::kBFloat16);
}

TEST(Recompute, MoeGptWithAuxLossesIsBitwiseNoRecompute) {
  at::set_num_threads(1);
  ASSERT_OK_AND_ASSIGN(GptConfig c, GptPreset("moe-tiny-shared"));
  c.num_layers = 2;
  c.max_seq_len = 16;
  CheckEveryGranularity(c, at::kFloat);
  // The z-loss left out of the loss: its gradient never reaches the recomputed block.
  CheckEveryGranularity(c, at::kFloat, /*z_loss=*/false);
}

TEST(Recompute, LayersOutsideTheModelAreRefused) {
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(DenseConfig(), 3));
  EXPECT_THAT(model.set_recompute({Granularity::kFull, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("in [0, 2] (the model's blocks), got 3")));
  EXPECT_THAT(model.set_recompute({Granularity::kFull, -2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got -2")));
  EXPECT_OK(model.set_recompute({Granularity::kFull, 2}));
  EXPECT_EQ(model.recompute().layers, 2);
}

// The function on its own: two outputs (one whose gradient never arrives), a param with a tensor
// hook. fn runs once in forward and once in backward; the gradients are those of the plain
// computation; the param's hook runs once per backward, as without recompute (the nested
// autograd::grad differentiates a detached alias, not the param).
TEST(Recompute, FunctionRerunsOnceAndRunsTheParamsHooksOnce) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor x0 = at::randn({4, 3}, gen, at::kFloat);
  const at::Tensor w0 = at::randn({3, 3}, gen, at::kFloat);
  int calls = 0, recomputes = 0;
  const RecomputeFn fn = [&](const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& p,
                             bool recomputing) {
    ++calls;
    recomputes += recomputing;
    const at::Tensor h = at::tanh(in[0].mm(p[0]));
    return std::vector<at::Tensor>{h * in[0], h.sum()};
  };
  std::vector<at::Tensor> grads[2];
  int hook_runs[2] = {0, 0};
  for (int recompute = 0; recompute < 2; ++recompute) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor w = w0.clone().requires_grad_(true);
    w.register_hook([&hook_runs, recompute](const at::Tensor&) { ++hook_runs[recompute]; });
    const std::vector<at::Tensor> out = recompute ? Recompute(fn, {x}, {w}) : fn({x}, {w}, false);
    ASSERT_EQ(out.size(), 2u);
    (out[0] * out[0]).sum().backward();  // out[1] unused
    grads[recompute] = {x.grad(), w.grad()};
  }
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(recomputes, 1);
  EXPECT_EQ(hook_runs[0], 1);
  EXPECT_EQ(hook_runs[1], 1);
  EXPECT_TRUE(at::equal(grads[0][0], grads[1][0])) << "input gradient";
  EXPECT_TRUE(at::equal(grads[0][1], grads[1][1])) << "param gradient";
}

// A recomputed forward's logits are bitwise the plain forward's, in grad mode (the blocks run on
// detached aliases whose graph is dropped) and under an evaluation's no-grad (where nothing is
// kept and each block runs once).
TEST(Recompute, ForwardLogitsAreThePlainForwards) {
  at::set_num_threads(1);
  ASSERT_OK_AND_ASSIGN(Gpt model, Gpt::Create(DenseConfig(), 3, at::kBFloat16));
  const at::Tensor tokens = Ids(2, 16, 256, 5);
  const Documents documents = MakeDocuments(16);
  for (const Documents* docs : {static_cast<const Documents*>(nullptr), &documents}) {
    for (const bool grad : {true, false}) {
      at::AutoGradMode mode(grad);
      ASSERT_OK(model.set_recompute({}));
      ASSERT_OK_AND_ASSIGN(const at::Tensor plain, model.Forward(tokens, docs));
      for (const Granularity g : {Granularity::kFull, Granularity::kSelective}) {
        ASSERT_OK(model.set_recompute({g, -1}));
        ASSERT_OK_AND_ASSIGN(const at::Tensor recomputed, model.Forward(tokens, docs));
        EXPECT_EQ(recomputed.requires_grad(), grad);
        EXPECT_TRUE(at::equal(plain, recomputed))
            << (g == Granularity::kFull ? "full" : "selective") << (grad ? ", grad mode" : ", no-grad")
            << (docs != nullptr ? ", documents" : ", rows");
      }
    }
  }
}

// Tensor parallelism on 2 real Gloo ranks: the recomputed blocks run their tp all-reduces again in
// backward (every rank at the same point); each rank's loss and gradients are bitwise its own
// without recompute.
TEST(Recompute, TensorParallelRanksAreBitwiseNoRecompute) {
  RunOnRanks(
      2,
      [](Communicator& comm) {
        at::set_num_threads(1);
        GptConfig c = DenseConfig();
        c.num_kv_heads = 2;  // one KV group per tp rank
        ASSERT_OK_AND_ASSIGN(Gpt model,
                             Gpt::Create(c, 3, at::kFloat, at::kCPU, {}, TensorParallel{&comm}));
        const Documents documents = MakeDocuments(c.max_seq_len);
        const StepResult reference = Step(model, &documents);
        for (const Granularity g : {Granularity::kFull, Granularity::kSelective}) {
          ASSERT_OK(model.set_recompute({g, -1}));
          ExpectSame(reference, Step(model, &documents), model,
                     absl::StrCat(g == Granularity::kFull ? "full" : "selective", ", tp rank ",
                                  comm.rank()));
        }
        ASSERT_OK(model.TakeCollectiveError());
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(180)));
}

}  // namespace
}  // namespace orthoshard::model
