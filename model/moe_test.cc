// The mixture-of-experts MLP (moe.h) and MoE Gpt models (model.h):
//   - the MoE presets' parameter counts (GptParamCount, GptHiddenMatrixCount, GptExpertParamCount)
//     are the built models';
//   - MoeMlp against an independent PyTorch reference computed live by testdata/moe_reference.py
//     (Hugging Face Mixtral's per-expert loop): the routing decisions exactly, the fp32 output
//     within a first-order fp32 error bound of the fp64 value (derived in the script), the
//     load-balancing and z losses within their bounds, and every gradient in fp64; with a shared
//     expert and with top-3 of 4 too;
//   - expert parallelism on 2 real Gloo ranks (collectives/testing/multi_rank.h): at ep 2 a rank
//     holds exactly its experts with the values they have at ep 1; the forward (logits, routing,
//     aux losses) and every dense gradient are bitwise those of the ep-1 model on the same tokens,
//     and the experts' gradients are the sum over ranks of the ep-1 gradients;
//   - a peer that dies or hangs during the dispatch or combine all-to-all: Forward/backward fail
//     within the communicator's timeout with the all-to-all and the peer's rank named.
#include "model/moe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <signal.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/python.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace orthoshard::model {
namespace {

using collectives::Communicator;
using collectives::testing::LaunchOnRanks;
using collectives::testing::RunOnRanks;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr char kScript[] = "model/testdata/moe_reference.py";

// ---- parameter counts ----------------------------------------------------------------------

TEST(MoeConfig, PresetCountsAreTheBuiltModels) {
  for (const char* preset : {"moe-tiny", "moe-tiny-shared", "moe-small"}) {
    ASSERT_OK_AND_ASSIGN(const GptConfig c, GptPreset(preset));
    ASSERT_OK(ValidateConfig(c));
    ASSERT_OK_AND_ASSIGN(const Gpt model, Gpt::CreateUninitialized(c));
    int64_t hidden = 0, experts = 0, routers = 0;
    for (const ModelParam& p : model.params()) {
      if (p.kind == ParamKind::kHidden) hidden += p.tensor.numel();
      if (p.kind == ParamKind::kRouter) routers += p.tensor.numel();
      if (p.expert >= 0) {
        experts += p.tensor.numel();
        EXPECT_EQ(p.kind, ParamKind::kHidden) << preset << " " << p.name;
        EXPECT_THAT(p.name, HasSubstr(absl::StrCat(".mlp.experts.", p.expert, "."))) << preset;
      }
    }
    EXPECT_EQ(model.num_params(), GptParamCount(c)) << preset;
    EXPECT_EQ(hidden, GptHiddenMatrixCount(c)) << preset;
    EXPECT_EQ(experts, GptExpertParamCount(c)) << preset;
    // Router [E, C] per layer, plus a [1, C] gate with a shared expert.
    EXPECT_EQ(routers, c.num_layers * c.hidden * (c.num_experts + (c.moe_shared_ffn_hidden > 0)))
        << preset;
  }
  // The moe-small comment's claim: the same active expert width as small's F.
  ASSERT_OK_AND_ASSIGN(const GptConfig small, GptPreset("small"));
  ASSERT_OK_AND_ASSIGN(const GptConfig moe_small, GptPreset("moe-small"));
  EXPECT_EQ(moe_small.moe_top_k * moe_small.moe_ffn_hidden, small.ffn_hidden);
  EXPECT_EQ(GptExpertParamCount(small), 0);
}

// ---- MoeMlp against the PyTorch reference ----------------------------------------------------

struct Records {
  absl::Status status;
  std::string script_output;
  std::map<std::string, at::Tensor> tensors;

  const at::Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("reference record missing: " + name);
    return it->second;
  }
};

// moe_reference.py's records, computed once per test process, on this machine.
const Records& Reference() {
  static const Records* records = [] {
    auto* r = new Records;
    absl::StatusOr<std::string> python = orthoshard::testing::ProjectPython(kScript);
    if (!python.ok()) {
      r->status = python.status();
      return r;
    }
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string out = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/moe_reference.pt");
    const orthoshard::testing::CommandResult run =
        orthoshard::testing::RunPython(*python, kScript, {out});
    r->script_output = run.output;
    if (run.exit_code != 0) {
      r->status = absl::InternalError(absl::StrCat(kScript, " exited ", run.exit_code, ": ",
                                                   run.output));
      return r;
    }
    std::ifstream in(out, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    for (const auto& entry : torch::jit::pickle_load(bytes).toGenericDict()) {
      r->tensors[entry.key().toStringRef()] = entry.value().toTensor();
    }
    std::remove(out.c_str());
    return r;
  }();
  return *records;
}

// MoeMlp over case `name`'s inputs in `dtype`, every weight a leaf.
struct CaseRun {
  GptConfig config;
  MoeWeights weights;
  at::Tensor m, out;
  MoeAux aux;
};

CaseRun RunCase(const Records& ref, const std::string& name, at::ScalarType dtype) {
  CaseRun run;
  const at::Tensor c = ref.at(name + "/config");  // C, E, k, F_e, F_s
  run.config.hidden = c[0].item<int64_t>();
  run.config.num_experts = c[1].item<int64_t>();
  run.config.moe_top_k = c[2].item<int64_t>();
  run.config.moe_ffn_hidden = c[3].item<int64_t>();
  run.config.moe_shared_ffn_hidden = c[4].item<int64_t>();
  auto leaf = [&](const at::Tensor& t) { return t.to(dtype).clone().set_requires_grad(true); };
  run.m = leaf(ref.at(name + "/input/m"));
  run.weights.router = leaf(ref.at(name + "/input/router"));
  for (int64_t e = 0; e < run.config.num_experts; ++e) {
    run.weights.fc1.push_back(leaf(ref.at(name + "/input/fc1")[e]));
    run.weights.fc2.push_back(leaf(ref.at(name + "/input/fc2")[e]));
  }
  if (run.config.moe_shared_ffn_hidden > 0) {
    run.weights.shared_fc1 = leaf(ref.at(name + "/input/shared_fc1"));
    run.weights.shared_fc2 = leaf(ref.at(name + "/input/shared_fc2"));
    run.weights.shared_gate = leaf(ref.at(name + "/input/shared_gate"));
  }
  absl::Status error;
  run.out = MoeMlp(run.config, run.weights, ExpertParallel{}, run.m, &run.aux, &error);
  EXPECT_OK(error);
  return run;
}

double MaxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

class MoeMlpReference : public ::testing::TestWithParam<std::string> {};

// fp32, as training runs it: the routing decisions exactly, the output within the script's
// first-order fp32 bound of the fp64 value (forward_error_bound: every sum of n terms within
// gamma_n of its magnitudes, so it holds for any summation order), the aux losses within theirs.
TEST_P(MoeMlpReference, Fp32ForwardRoutingAndAuxLosses) {
  const Records& ref = Reference();
  ASSERT_OK(ref.status);
  const std::string name = GetParam();
  at::set_num_threads(1);
  const CaseRun run = RunCase(ref, name, at::kFloat);
  EXPECT_TRUE(at::equal(run.aux.top_experts, ref.at(name + "/top_experts")))
      << name << ": routing decisions differ from torch.topk's";
  EXPECT_TRUE(at::equal(run.aux.tokens_per_expert, ref.at(name + "/counts"))) << name;
  const at::Tensor out64 = ref.at(name + "/out64");
  const at::Tensor bound = ref.at(name + "/out_bound");
  const double ratio = ((run.out.detach().to(at::kDouble) - out64).abs() / bound).max()
                           .item<double>();
  EXPECT_LE(ratio, 1.0) << name << ": fp32 output outside the fp32 error bound of the exact value";
  const double lb = run.aux.load_balance.item<double>();
  const double z = run.aux.z_loss.item<double>();
  EXPECT_NEAR(lb, ref.at(name + "/load_balance64").item<double>(),
              ref.at(name + "/load_balance_bound").item<double>())
      << name;
  EXPECT_NEAR(z, ref.at(name + "/z_loss64").item<double>(),
              ref.at(name + "/z_loss_bound").item<double>())
      << name;
  std::printf("%s: routing exact; output within %.3f of its fp32 bound (%s the fp32 reference); "
              "load balance %.6f, z-loss %.6f\n",
              name.c_str(), ratio,
              at::equal(run.out.detach(), ref.at(name + "/out_hf32")) ? "bitwise equal to"
                                                                       : "not bitwise",
              lb, z);
}

// fp64 params (the router still in fp32, as moe.cc computes it): the gradients of
// (out * dy).sum() + alpha load_balance + beta z_loss. Both sides compute the experts, the shared
// expert and its gate in fp64: each gradient element is a sum of at most N k = 222 products through
// at most ~10 roundings, within gamma_232 = 2.6e-14 (fp64 u = 1.1e-16) of the magnitude of its
// terms, which for these random inputs is at most ~100 x the largest gradient element: 1e-10 of the
// largest element leaves a ~40x margin. The router's gradient (and its share of m's) is computed
// in fp32 on both sides, by the same ATen ops on the same fp32 values except the fp64 gradients
// that reach them (rounded to fp32: at most one fp32 ulp apart, 6e-8 relative), propagated by a
// softmax backward and a matrix product over N tokens: 1e-5 of the largest element.
TEST_P(MoeMlpReference, Fp64Gradients) {
  const Records& ref = Reference();
  ASSERT_OK(ref.status);
  const std::string name = GetParam();
  at::set_num_threads(1);
  const CaseRun run = RunCase(ref, name, at::kDouble);
  ASSERT_TRUE(at::equal(run.aux.top_experts, ref.at(name + "/top_experts"))) << name;
  const at::Tensor coefficients = ref.at(name + "/coefficients");
  const at::Tensor objective = (run.out * ref.at(name + "/input/dy")).sum() +
                               run.aux.load_balance * coefficients[0].item<double>() +
                               run.aux.z_loss * coefficients[1].item<double>();
  objective.backward();
  double worst = 0;  // the largest |diff| in units of its tolerance
  auto expect_grad = [&](const at::Tensor& got, const at::Tensor& want, double tolerance,
                         const std::string& what) {
    ASSERT_TRUE(got.defined()) << name << " " << what << ": no gradient";
    const double scale = MaxAbs(want);
    ASSERT_GT(scale, 0) << name << " " << what;
    const double diff = MaxAbs(got - want);
    EXPECT_LE(diff, tolerance * scale) << name << " " << what << ": max |diff| " << diff
                                       << " vs largest element " << scale;
    worst = std::max(worst, diff / (tolerance * scale));
  };
  constexpr double kFp64 = 1e-10, kFp32 = 1e-5;
  const MoeWeights& w = run.weights;
  expect_grad(run.m.grad(), ref.at(name + "/grad/m"), kFp32, "m");
  expect_grad(w.router.grad(), ref.at(name + "/grad/router"), kFp32, "router");
  for (size_t e = 0; e < w.fc1.size(); ++e) {
    if (run.aux.tokens_per_expert[e].item<int64_t>() == 0) continue;  // no tokens, no gradient
    expect_grad(w.fc1[e].grad(), ref.at(name + "/grad/fc1")[e], kFp64, absl::StrCat("fc1 ", e));
    expect_grad(w.fc2[e].grad(), ref.at(name + "/grad/fc2")[e], kFp64, absl::StrCat("fc2 ", e));
  }
  if (w.shared_fc1.defined()) {
    expect_grad(w.shared_fc1.grad(), ref.at(name + "/grad/shared_fc1"), kFp64, "shared fc1");
    expect_grad(w.shared_fc2.grad(), ref.at(name + "/grad/shared_fc2"), kFp64, "shared fc2");
    expect_grad(w.shared_gate.grad(), ref.at(name + "/grad/shared_gate"), kFp64, "shared gate");
  }
  std::printf("%s: fp64 gradients within %.3g of their tolerances\n", name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeMlpReference,
                         ::testing::Values("mixtral", "shared", "top3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---- expert parallelism on 2 real ranks --------------------------------------------------------

at::Tensor Tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, t}, gen, at::TensorOptions().dtype(at::kLong));
}

std::map<std::string, at::Tensor> ByName(const Gpt& model) {
  std::map<std::string, at::Tensor> out;
  for (const ModelParam& p : model.params()) out[p.name] = p.tensor;
  return out;
}

// The sum of `t` over the ranks of `comm` (a fresh tensor).
at::Tensor SumOverRanks(Communicator& comm, const at::Tensor& t) {
  at::Tensor sum = t.detach().clone();
  auto work = comm.AllReduce(sum);
  EXPECT_OK(work.status());
  if (work.ok()) EXPECT_OK((*work)->Wait(comm.timeout()));
  return sum;
}

// At ep 2 rank r holds experts [4r, 4r + 4) of every layer, under their global names, with exactly
// the values the ep-1 model of the same seed gives them (ForEachInitialValue draws every expert in
// the whole model's order and drops the others'); every dense param (attention, router, shared
// expert and its gate) is the ep-1 model's too, and the two ranks' experts add up to
// GptExpertParamCount.
TEST(MoeExpertParallel, RanksHoldTheirExpertsWithTheEpOneValues) {
  RunOnRanks(
      2,
      [](Communicator& comm) {
        at::set_num_threads(1);
        ASSERT_OK_AND_ASSIGN(const GptConfig c, GptPreset("moe-tiny-shared"));
        ASSERT_OK_AND_ASSIGN(const Gpt whole, Gpt::Create(c, 5));
        ASSERT_OK_AND_ASSIGN(const Gpt part,
                             Gpt::Create(c, 5, at::kFloat, at::kCPU, ExpertParallel{&comm}));
        const std::map<std::string, at::Tensor> reference = ByName(whole);
        const int64_t local = c.num_experts / 2;
        int64_t expert_elements = 0;
        std::vector<int> held;
        for (const ModelParam& p : part.params()) {
          ASSERT_EQ(reference.count(p.name), 1u) << p.name;
          EXPECT_TRUE(at::equal(p.tensor, reference.at(p.name))) << p.name << " on rank "
                                                                 << comm.rank();
          if (p.expert < 0) continue;
          EXPECT_GE(p.expert, comm.rank() * local) << p.name;
          EXPECT_LT(p.expert, (comm.rank() + 1) * local) << p.name;
          expert_elements += p.tensor.numel();
          held.push_back(p.expert);
        }
        // 4 layers x 4 experts x (fc1, fc2).
        EXPECT_EQ(held.size(), static_cast<size_t>(c.num_layers * local * 2));
        EXPECT_EQ(part.num_params(), GptParamCount(c) - GptExpertParamCount(c) + expert_elements);
        const at::Tensor total =
            SumOverRanks(comm, at::tensor({static_cast<double>(expert_elements)}, at::kDouble));
        EXPECT_EQ(total.item<double>(), static_cast<double>(GptExpertParamCount(c)));
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(180)));
}

// Whether every expert of every layer got 0 or at least 16 of this rank's token copies: then each
// row of an expert's products is bitwise the same whatever else is in the product. ATen's fp32
// CPU matrix product takes another kernel for 1 to 3 rows, whose rounding differs (measured on
// AVX512 at every expert shape of the presets; from 4 rows on, a row's result does not depend on
// the row count); 16 leaves room for CPUs whose small-row path goes further. At ep 2 an expert's
// product holds both ranks' rows, at ep 1 this rank's only.
bool RowCountsKeepRowsIndependent(const Gpt& model) {
  for (const MoeAux& a : model.moe_aux()) {
    const at::Tensor n = a.tokens_per_expert;
    if (n.gt(0).logical_and(n.lt(16)).any().item<bool>()) return false;
  }
  return true;
}

// The same tokens through the ep-1 model and the ep-2 model (each rank its own tokens), fp32:
// nothing in the forward reduces in another order (the router and the attention are the same local
// ops; an expert's product computes each row on its own; the combine adds each token's k
// contributions in expert order at both), so the logits, the routing and the aux losses are
// bitwise equal, and so is every dense param's gradient (the experts' input gradients are again
// row-wise products). An expert's weight gradient is one product over the rows of both ranks at
// ep 2, two products (one per rank) added at ep 1: the same sum in another order, compared in fp64
// where that reordering moves it by at most gamma_(2Nk) ~ 1e-13 of its terms' magnitude (1e-10 of
// the largest element; measured below 1e-15).
TEST(MoeExpertParallel, EpTwoComputesWhatEpOneComputes) {
  RunOnRanks(
      2,
      [](Communicator& comm) {
        at::set_num_threads(1);
        ASSERT_OK_AND_ASSIGN(const GptConfig c, GptPreset("moe-tiny-shared"));
        const at::Tensor tokens = Tokens(4, c.max_seq_len, c.vocab_size, 100 + comm.rank());
        const at::Tensor targets = Tokens(4, c.max_seq_len, c.vocab_size, 200 + comm.rank());
        for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
          ASSERT_OK_AND_ASSIGN(const Gpt whole, Gpt::Create(c, 9, dtype));
          ASSERT_OK_AND_ASSIGN(const Gpt part,
                               Gpt::Create(c, 9, dtype, at::kCPU, ExpertParallel{&comm}));
          ASSERT_OK_AND_ASSIGN(const at::Tensor whole_loss, whole.Loss(tokens, targets));
          ASSERT_OK_AND_ASSIGN(const at::Tensor part_loss, part.Loss(tokens, targets));
          ASSERT_EQ(whole.moe_aux().size(), static_cast<size_t>(c.num_layers));
          ASSERT_EQ(part.moe_aux().size(), whole.moe_aux().size());
          auto objective = [](const Gpt& model, const at::Tensor& loss) {
            at::Tensor o = loss;
            for (const MoeAux& a : model.moe_aux()) o = o + a.load_balance * 0.01 + a.z_loss * 1e-3;
            return o;
          };
          const bool fp32 = dtype == at::kFloat;
          for (size_t l = 0; l < whole.moe_aux().size(); ++l) {
            const MoeAux& w = whole.moe_aux()[l];
            const MoeAux& p = part.moe_aux()[l];
            EXPECT_TRUE(at::equal(w.top_experts, p.top_experts)) << "layer " << l;
            EXPECT_TRUE(at::equal(w.tokens_per_expert, p.tokens_per_expert)) << "layer " << l;
            if (!fp32) continue;
            EXPECT_TRUE(at::equal(w.load_balance, p.load_balance)) << "layer " << l;
            EXPECT_TRUE(at::equal(w.z_loss, p.z_loss)) << "layer " << l;
          }
          if (fp32) {
            ASSERT_TRUE(RowCountsKeepRowsIndependent(whole))
                << "the tokens give an expert 1-15 rows; pick others";
            EXPECT_TRUE(at::equal(whole_loss, part_loss))
                << whole_loss.item<double>() - part_loss.item<double>();
          }
          objective(whole, whole_loss).backward();
          objective(part, part_loss).backward();
          // In the whole model's order on both ranks: every expert's gradient summed over the
          // ranks (one all-reduce each), compared where this rank holds that expert.
          const std::map<std::string, at::Tensor> held = ByName(part);
          double worst = 0;
          for (const ModelParam& w : whole.params()) {
            ASSERT_TRUE(w.tensor.grad().defined()) << w.name;
            const auto it = held.find(w.name);
            if (w.expert < 0) {
              ASSERT_TRUE(it != held.end()) << w.name;
              if (fp32) EXPECT_TRUE(at::equal(it->second.grad(), w.tensor.grad())) << w.name;
              continue;
            }
            // At ep 1 each rank has the part of its own tokens; at ep 2 the holder has both.
            const at::Tensor want = SumOverRanks(comm, w.tensor.grad());
            if (it == held.end() || fp32) continue;
            ASSERT_TRUE(it->second.grad().defined()) << w.name;
            const double diff = MaxAbs(it->second.grad() - want) / MaxAbs(want);
            worst = std::max(worst, diff);
            EXPECT_LE(diff, 1e-10) << w.name;
          }
          if (!fp32) {
            std::printf("fp64 expert gradients: largest relative difference %.3g\n", worst);
          }
        }
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(240)));
}

// A peer SIGKILLed before the dispatch: the survivor's Forward fails (not hangs) with an error
// naming the all-to-all, the ep group and the peer. Then a peer alive but never joining the
// combine all-to-all of the backward (a hang): the survivor's backward fails within the
// communicator's timeout, Gpt::TakeCollectiveError carrying the same.
TEST(MoeExpertParallel, APeerLostInTheDispatchFailsTheStepNamingIt) {
  for (const bool hang : {false, true}) {
    const collectives::testing::MultiRankOutcome outcome = LaunchOnRanks(
        2,
        [hang](Communicator& comm) {
          at::set_num_threads(1);
          ASSERT_OK_AND_ASSIGN(const GptConfig c, GptPreset("moe-tiny"));
          ASSERT_OK_AND_ASSIGN(const Gpt part,
                               Gpt::Create(c, 3, at::kFloat, at::kCPU, ExpertParallel{&comm}));
          const at::Tensor tokens = Tokens(2, 16, c.vocab_size, 7 + comm.rank());
          ASSERT_OK(part.Forward(tokens).status());  // a healthy step first
          if (comm.rank() == 1) {
            if (hang) {
              ASSERT_OK(part.Loss(tokens, tokens).status());  // joins the forward, never backward
              absl::SleepFor(comm.timeout() + absl::Seconds(5));
              return;
            }
            // Let rank 0 read the last bytes first (a killed socket may discard unread data).
            absl::SleepFor(absl::Milliseconds(500));
            raise(SIGKILL);
          }
          if (!hang) {
            const absl::Status lost = part.Forward(tokens).status();
            std::printf("peer killed: %s\n", lost.ToString().c_str());
            EXPECT_THAT(lost,
                        StatusIs(absl::StatusCode::kUnavailable,
                                 AllOf(HasSubstr("moe dispatch counts all-to-all on ep rank 0 "
                                                 "of 2"),
                                       HasSubstr("rank 1"))));
            return;
          }
          ASSERT_OK_AND_ASSIGN(const at::Tensor loss, part.Loss(tokens, tokens));
          EXPECT_THROW(loss.backward(), c10::Error);
          // Its own wait and the engine's end at the same timeout: either reports it first.
          const absl::Status error = part.TakeCollectiveError();
          std::printf("peer hung: %s\n", error.ToString().c_str());
          EXPECT_THAT(error.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                          absl::StatusCode::kUnavailable))
              << error;
          EXPECT_THAT(error.message(),
                      AllOf(HasSubstr("moe combine all-to-all (backward) on ep rank 0 of 2"),
                            HasSubstr("rank 1")));
          EXPECT_OK(part.TakeCollectiveError());  // taken
        },
        collectives::testing::WithTimeouts(absl::Seconds(3), absl::Seconds(120)));
    if (collectives::testing::InRankProcess()) continue;  // the other launch's rank process
    EXPECT_TRUE(outcome.passed[0]) << outcome.Transcript();
    if (hang) {
      EXPECT_TRUE(outcome.passed[1]) << outcome.Transcript();
    } else {
      EXPECT_EQ(outcome.launch.exit_code, 128 + SIGKILL) << outcome.Transcript();
      EXPECT_EQ(outcome.launch.first_failed_rank, 1) << outcome.Transcript();
    }
  }
}

}  // namespace
}  // namespace orthoshard::model
