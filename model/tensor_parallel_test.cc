// Tensor parallelism of the Gpt (model/tensor_parallel.h, model.h) on real Gloo ranks
// (collectives/testing/multi_rank.h), against the tp-1 Gpt built in the same rank process from the
// same seed:
//   - ValidateTensorParallel's rules and messages; Create refusing a bad tp;
//   - every param of a tp-2 and tp-4 model is bitwise the tp-1 param's slice (TpSlice with its
//     ModelParam::tp), with the split and fused-block fields a tp layout needs;
//   - the logits (gathered over the vocabulary in the test), the loss (the same on every tp rank)
//     and every param's gradient (vs the slice of the tp-1 gradient) agree with tp 1 in fp64 within
//     a bound derived from the reduction orders, and in fp32 within the fp32 rounding the tp-1
//     model itself makes; for a GQA config with an untied head and an MHA config with tied
//     embeddings, targets with ignored positions, both reductions, with and without documents;
//     mixed precision (bf16) within the bf16 tp-1 model's own rounding;
//   - QK-clip: the max-logit record gets this rank's heads only; QkClipRowScales of a shard is
//     the slice of the whole weight's factors;
//   - a tp rank that does not take part in a collective (forward, then backward): the survivor
//     fails within the communicator's timeout with a status naming the tp collective.
#include "model/tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/testing/multi_rank.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/qk_clip.h"

namespace orthoshard::model {
namespace {

using collectives::Communicator;
using collectives::testing::LaunchOnRanks;
using collectives::testing::RunOnRanks;
using ::orthoshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// GQA (4 query heads in 2 KV groups), untied head: the tp-2 config (1 KV group per rank).
GptConfig GqaConfig() {
  GptConfig c;
  c.vocab_size = 96;
  c.max_seq_len = 16;
  c.num_layers = 2;
  c.hidden = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden = 64;
  c.tie_embeddings = false;
  return c;
}

// 8 query heads in 4 KV groups (GQA still), tied: splits over tp 4 too.
GptConfig WideConfig() {
  GptConfig c;
  c.vocab_size = 128;
  c.max_seq_len = 16;
  c.num_layers = 2;
  c.hidden = 64;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.ffn_hidden = 96;
  c.tie_embeddings = true;
  return c;
}

// Plain multi-head attention, tied.
GptConfig MhaTiedConfig() {
  GptConfig c = GqaConfig();
  c.num_kv_heads = c.num_heads;
  c.tie_embeddings = true;
  return c;
}

at::Tensor Ids(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, t}, gen, at::TensorOptions().dtype(at::kLong));
}

double MaxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// max |a - b| / max |b|, in double.
double RelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.detach().to(at::kDouble);
  return MaxAbs(a.detach().to(at::kDouble) - bd) / std::max(MaxAbs(bd), 1e-300);
}

std::map<std::string, const ModelParam*> ByName(const Gpt& model) {
  std::map<std::string, const ModelParam*> out;
  for (const ModelParam& p : model.params()) out[p.name] = &p;
  return out;
}

// The whole [B, T, V] logits from every tp rank's [B, T, V / tp] columns.
at::Tensor GatherVocab(Communicator& comm, const at::Tensor& local) {
  const at::Tensor in = local.detach().contiguous();
  at::Tensor out = at::empty({comm.size() * in.numel()}, in.options());
  auto work = comm.AllGather(in, out);
  EXPECT_OK(work.status());
  if (work.ok()) EXPECT_OK((*work)->Wait(comm.timeout()));
  std::vector<int64_t> shape = {comm.size()};
  for (int64_t s : in.sizes()) shape.push_back(s);
  // [tp, B, T, Vl] -> [B, T, tp, Vl] -> [B, T, V]
  return out.view(shape).permute({1, 2, 0, 3}).reshape({in.size(0), in.size(1), -1});
}

// Every rank's copy of a scalar, for checking they agree.
std::vector<double> GatherScalar(Communicator& comm, const at::Tensor& scalar) {
  const at::Tensor in = scalar.detach().to(at::kDouble).reshape({1});
  at::Tensor out = at::empty({comm.size()}, in.options());
  auto work = comm.AllGather(in, out);
  EXPECT_OK(work.status());
  if (work.ok()) EXPECT_OK((*work)->Wait(comm.timeout()));
  return std::vector<double>(out.data_ptr<double>(), out.data_ptr<double>() + comm.size());
}

// ---- validation -----------------------------------------------------------------------------

TEST(ValidateTensorParallel, DividesHeadsKvGroupsFfnAndVocabulary) {
  EXPECT_OK(ValidateTensorParallel(GqaConfig(), 1));
  EXPECT_OK(ValidateTensorParallel(GqaConfig(), 2));
  EXPECT_OK(ValidateTensorParallel(WideConfig(), 4));
  EXPECT_THAT(ValidateTensorParallel(GqaConfig(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tp must be >= 1, got 0")));
  // KV 2 does not split over 4 ranks; gcd(4, 2, 64, 96) = 2.
  EXPECT_THAT(ValidateTensorParallel(GqaConfig(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tp 4 does not divide num_kv_heads 2"),
                             HasSubstr("tp sizes that divide all of them: 1, 2"))));
  GptConfig c = GqaConfig();
  c.num_kv_heads = 4;
  EXPECT_THAT(ValidateTensorParallel(c, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tp 3 does not divide num_heads 4")));
  c.ffn_hidden = 66;
  EXPECT_THAT(ValidateTensorParallel(c, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tp 4 does not divide ffn_hidden 66")));
  c = GqaConfig();
  c.vocab_size = 97;
  EXPECT_THAT(ValidateTensorParallel(c, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tp 2 does not divide vocab_size 97"),
                             HasSubstr("the vocabulary is not padded"),
                             HasSubstr("tp sizes that divide all of them: 1"))));
  ASSERT_OK_AND_ASSIGN(const GptConfig gpt2, GptPreset("gpt2-124m"));
  EXPECT_THAT(ValidateTensorParallel(gpt2, 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tp 8 does not divide num_heads 12"),
                             HasSubstr("tp sizes that divide all of them: 1, 2, 4"))));
  ASSERT_OK_AND_ASSIGN(const GptConfig moe, GptPreset("moe-tiny"));
  EXPECT_OK(ValidateTensorParallel(moe, 1));
  EXPECT_THAT(ValidateTensorParallel(moe, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mixture-of-experts model is not supported yet")));
  c.num_heads = 0;
  EXPECT_THAT(ValidateTensorParallel(c, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_heads must be > 0")));
}

// QkClipRowScales of rank r's shard is rows TpRuns of the whole weight's factors, and reads only
// the shard's heads (the others' NaN entries change nothing).
TEST(QkClipTensorParallel, ShardFactorsAreTheSliceOfTheWholeFactors) {
  const GptConfig c = WideConfig();  // H 8, KV 4, D 8
  const at::Tensor logits = at::tensor({1.0f, 9.0f, 2.0f, 3.0f, 7.0f, 4.0f, 0.5f, 6.0f});
  int64_t whole_clipped = 0;
  const at::Tensor whole = QkClipRowScales(c, logits, 5.0, &whole_clipped);
  EXPECT_EQ(whole_clipped, 3);  // groups {1, 9}, {7, 4}, {0.5, 6}
  const int64_t rows = (c.num_heads + 2 * c.num_kv_heads) * (c.hidden / c.num_heads);
  for (const int tp : {2, 4}) {
    int64_t clipped_total = 0;
    for (int r = 0; r < tp; ++r) {
      const TpSplit split{0, 1, tp, r};
      // Another rank's heads: NaN, which would read as "not clipped" if it were read at all.
      at::Tensor own_only = at::full({c.num_heads}, std::nanf(""));
      const int64_t heads = c.num_heads / tp;
      own_only.narrow(0, r * heads, heads).copy_(logits.narrow(0, r * heads, heads));
      int64_t clipped = 0;
      const at::Tensor shard = QkClipRowScales(c, own_only, 5.0, &clipped, split);
      EXPECT_TRUE(at::equal(shard, TpSlice(whole.view({rows, 1}), split).view({-1})))
          << "tp " << tp << " rank " << r;
      clipped_total += clipped;
    }
    EXPECT_EQ(clipped_total, whole_clipped) << "tp " << tp;
  }
}

// ---- params ---------------------------------------------------------------------------------

// At tp 2 (and 4) every param is the tp-1 param's slice, bitwise, with its split recorded; the
// local elements add up to the whole model's; a config tp does not divide is refused.
void CheckParamsAreSlices(int world) {
  RunOnRanks(
      world,
      [](Communicator& comm) {
        at::set_num_threads(1);
        const int tp = comm.size();
        std::vector<GptConfig> configs = {WideConfig()};
        if (tp == 2) configs.push_back(GqaConfig()), configs.push_back(MhaTiedConfig());
        for (const GptConfig& c : configs) {
          ASSERT_OK_AND_ASSIGN(const Gpt whole, Gpt::Create(c, 11, at::kDouble));
          ASSERT_OK_AND_ASSIGN(const Gpt part, Gpt::Create(c, 11, at::kDouble, at::kCPU, {},
                                                           TensorParallel{&comm}));
          EXPECT_EQ(part.tensor_parallel().size(), tp);
          ASSERT_EQ(part.params().size(), whole.params().size());
          const int64_t G = c.num_kv_heads / tp, R = c.num_heads / c.num_kv_heads;
          const int64_t D = c.hidden / c.num_heads;
          int64_t global_elements = 0;
          for (size_t i = 0; i < part.params().size(); ++i) {
            const ModelParam& p = part.params()[i];
            const ModelParam& w = whole.params()[i];
            ASSERT_EQ(p.name, w.name);
            EXPECT_EQ(p.tp.size, tp) << p.name;
            EXPECT_EQ(p.tp.rank, comm.rank()) << p.name;
            EXPECT_EQ(w.tp.dim, -1) << p.name;  // tp 1: replicated
            EXPECT_EQ(p.kind, w.kind) << p.name;
            EXPECT_EQ(p.layer, w.layer) << p.name;
            EXPECT_EQ(p.also_read_by, w.also_read_by) << p.name;
            int want_dim = -1;
            int64_t want_parts = 1;
            if (p.name.find("qkv") != std::string::npos || p.name.find("embedding") == 0 ||
                p.name.find("output_layer") == 0) {
              want_dim = 0;
            } else if (p.name.find("fc1") != std::string::npos) {
              want_dim = 0, want_parts = 2;
            } else if (p.name.find("proj") != std::string::npos ||
                       p.name.find("fc2") != std::string::npos) {
              want_dim = 1;
            }
            EXPECT_EQ(p.tp.dim, want_dim) << p.name;
            EXPECT_EQ(p.tp.parts, want_parts) << p.name;
            EXPECT_OK(ValidateTpSplit(w.tensor.sizes().vec(), p.tp, p.name));
            EXPECT_EQ(p.tensor.sizes().vec(), TpLocalShape(w.tensor.sizes().vec(), p.tp))
                << p.name;
            EXPECT_TRUE(at::equal(p.tensor, TpSlice(w.tensor.detach(), p.tp)))
                << p.name << " on tp rank " << comm.rank();
            // The split is the whole matrix's at any tp: KV groups of {R D, D, D} for QKV, the
            // gate and up halves for fc1.
            EXPECT_EQ(p.split.num_groups, w.split.num_groups) << p.name;
            EXPECT_EQ(p.split.block_rows, w.split.block_rows) << p.name;
            if (p.name.find("qkv") != std::string::npos) {
              EXPECT_EQ(p.split.num_groups, c.num_kv_heads) << p.name;
              EXPECT_EQ(p.split.block_rows, (std::vector<int64_t>{R * D, D, D})) << p.name;
              // This rank's slice holds whole groups: G of them.
              EXPECT_EQ(p.tensor.size(0), G * (R + 2) * D) << p.name;
            } else if (p.name.find("fc1") != std::string::npos) {
              EXPECT_EQ(p.split.num_groups, 1) << p.name;
              EXPECT_EQ(p.split.block_rows,
                        (std::vector<int64_t>{c.ffn_hidden, c.ffn_hidden}))
                  << p.name;
            }
            global_elements += p.tp.split() ? p.tensor.numel() * tp : p.tensor.numel();
          }
          EXPECT_EQ(global_elements, GptParamCount(c));
        }
        // tp does not divide KV 2 (at tp 4) / vocabulary 97 (at tp 2): refused before any param.
        GptConfig bad = GqaConfig();
        if (tp == 2) bad.vocab_size = 97;
        EXPECT_THAT(Gpt::Create(bad, 1, at::kFloat, at::kCPU, {}, TensorParallel{&comm}).status(),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr(absl::StrCat("tp ", tp, " does not divide"))));
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(180)));
}

TEST(TensorParallelGpt, ParamsAreSlicesOfTheTpOneModelAtTp2) { CheckParamsAreSlices(2); }
TEST(TensorParallelGpt, ParamsAreSlicesOfTheTpOneModelAtTp4) { CheckParamsAreSlices(4); }

// ---- forward, loss and gradients --------------------------------------------------------------

// fp64: tp changes only the order of additions, never which terms are added (the vocab-parallel
// embedding adds exact zeros; every other op is the same per element). The sums that are
// reordered: the row-parallel products over H D = C and F (partial sums over C / tp and F / tp
// terms, then added across ranks), the column-parallel input gradients (over (H + 2 KV) D, 2 F and
// V rows), the cross entropy's max and sum over V, and the weight gradients' sums over the B T
// tokens are unchanged. A sum of n terms in any order is within (n - 1) u sum|terms| of the exact
// sum (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4), u = 2^-53; here
// n <= max(2 F, V, (H + 2 KV) D) = 192 (the wide config's 2F and (H+2KV)D: 192, V 128), so each
// reordered sum moves by at most 192 u = 2.1e-14 of its terms' magnitude. Through 2 layers the
// difference is carried by at most ~2 L + 2 = 6 such sums in a row, each result's terms of at
// most the magnitude of the largest element of the tensor compared times the number of terms
// (192, a loose factor for cancellation): 6 x 192 x 2.1e-14 = 2.5e-11 of the tensor's largest
// element; 1e-10 leaves a factor 4 for the softmax and RMSNorm's Jacobians, each bounded by
// O(1) on these inputs (norms of an fp64 model at init). Measured: below 1e-14 (printed).
constexpr double kFp64Bound = 1e-10;
// fp32: the same reordering with u = 2^-24. Rather than 2^29 x the fp64 bound (which would test
// nothing), the tp model's fp32 result is held to the fp32 rounding error that the tp-1 model
// makes on the same inputs: both compute the same exact function with the same op count and
// differ only in the order of additions, so Higham's bound is the same E for both, and
// |tp - tp1| <= |tp - exact| + |tp1 - exact| <= 2 E. E is estimated by the measured
// max |tp1_fp32 - tp1_fp64| (the fp64 model standing for the exact one: its error is 2^-29 of
// fp32's); the test allows 4 x that (2 E and a factor 2 for the estimate being a single sample
// of a bound), floored at 64 fp32 ulps of the tensor's largest element for tensors where the tp-1
// error happens to be tiny.
constexpr double kFp32EstimateFactor = 4.0;
constexpr double kFp32FloorUlps = 64.0 * 5.9604644775390625e-8;  // 64 x 2^-24

struct Case {
  bool documents = false;
  LossReduction reduction = LossReduction::kMean;
};

// One tp-rank run of the comparison: `config`, both dtypes, with and without documents, both
// reductions, targets with ignored positions.
void CompareWithTpOne(Communicator& comm, const GptConfig& c) {
  const int tp = comm.size();
  const int64_t B = 3, T = c.max_seq_len, V = c.vocab_size;
  // The same tokens on every tp rank (tensor parallelism splits the model, not the batch).
  const at::Tensor tokens = Ids(B, T, V, 101);
  at::Tensor targets = Ids(B, T, V, 202);
  targets.view({-1}).narrow(0, 5, 7).fill_(kIgnoredTarget);
  targets[2][T - 1] = kIgnoredTarget;
  // Documents: row 0 one document, row 1 split at 5 and 11, row 2 at 1.
  at::Tensor segments = at::zeros({B, T}, at::kLong), positions = at::zeros({B, T}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> starts =
        b == 0 ? std::vector<int64_t>{0} : b == 1 ? std::vector<int64_t>{0, 5, 11}
                                                   : std::vector<int64_t>{0, 1};
    for (int64_t t = 0, doc = 0; t < T; ++t) {
      if (doc + 1 < static_cast<int64_t>(starts.size()) && t == starts[doc + 1]) ++doc;
      segments[b][t] = doc;
      positions[b][t] = t - starts[doc];
    }
  }
  const Documents documents{segments, positions};

  ASSERT_OK_AND_ASSIGN(const Gpt reference, Gpt::Create(c, 7, at::kDouble));  // fp64, tp 1
  for (const Case& k : {Case{false, LossReduction::kMean}, Case{false, LossReduction::kSum},
                        Case{true, LossReduction::kMean}, Case{true, LossReduction::kSum}}) {
    const Documents* docs = k.documents ? &documents : nullptr;
    const std::string what =
        absl::StrCat(c.num_kv_heads < c.num_heads ? "GQA, " : "MHA, ",
                     c.tie_embeddings ? "tied, " : "untied, ", k.documents ? "documents" : "rows",
                     k.reduction == LossReduction::kSum ? ", sum" : ", mean");
    // The fp64 tp-1 reference's logits, loss and gradients (for the fp32 estimate of E).
    for (const ModelParam& p : reference.params()) p.tensor.mutable_grad() = at::Tensor();
    ASSERT_OK_AND_ASSIGN(const at::Tensor ref_logits, reference.Forward(tokens, docs));
    ASSERT_OK_AND_ASSIGN(const at::Tensor ref_loss,
                         reference.Loss(tokens, targets, docs, k.reduction));
    ref_loss.backward();

    for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
      const bool fp64 = dtype == at::kDouble;
      ASSERT_OK_AND_ASSIGN(const Gpt whole, Gpt::Create(c, 7, dtype));
      ASSERT_OK_AND_ASSIGN(const Gpt part,
                           Gpt::Create(c, 7, dtype, at::kCPU, {}, TensorParallel{&comm}));
      // The bound for a compared pair (tp, tp1) given the fp64 reference.
      auto bound = [&](const at::Tensor& tp1, const at::Tensor& ref) {
        if (fp64) return kFp64Bound;
        return std::max(kFp32EstimateFactor * RelDiff(tp1, ref), kFp32FloorUlps);
      };
      double worst = 0;
      auto check = [&](const std::string& name, const at::Tensor& got, const at::Tensor& tp1,
                       const at::Tensor& ref) {
        ASSERT_EQ(got.sizes(), tp1.sizes()) << name;
        const double diff = RelDiff(got, tp1), allowed = bound(tp1, ref);
        worst = std::max(worst, diff / allowed);
        EXPECT_LE(diff, allowed) << name << " (" << what << ", " << c10::toString(dtype)
                                 << ", tp rank " << comm.rank() << ")";
      };

      ASSERT_OK_AND_ASSIGN(const at::Tensor local_logits, part.Forward(tokens, docs));
      ASSERT_EQ(local_logits.sizes(), (at::IntArrayRef{B, T, V / tp}));
      ASSERT_OK_AND_ASSIGN(const at::Tensor whole_logits, whole.Forward(tokens, docs));
      check("logits", GatherVocab(comm, local_logits), whole_logits, ref_logits);

      ASSERT_OK_AND_ASSIGN(const at::Tensor part_loss,
                           part.Loss(tokens, targets, docs, k.reduction));
      ASSERT_OK_AND_ASSIGN(const at::Tensor whole_loss,
                           whole.Loss(tokens, targets, docs, k.reduction));
      check("loss", part_loss, whole_loss, ref_loss);
      const std::vector<double> losses = GatherScalar(comm, part_loss);
      for (int r = 1; r < tp; ++r) EXPECT_EQ(losses[r], losses[0]) << "loss on tp rank " << r;

      part_loss.backward();
      whole_loss.backward();
      const std::map<std::string, const ModelParam*> tp1 = ByName(whole), ref = ByName(reference);
      for (const ModelParam& p : part.params()) {
        ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
        const at::Tensor& g1 = tp1.at(p.name)->tensor.grad();
        const at::Tensor& g0 = ref.at(p.name)->tensor.grad();
        check(p.name + " gradient", p.tensor.grad(), TpSlice(g1, p.tp), TpSlice(g0, p.tp));
      }
      ASSERT_OK(part.TakeCollectiveError());
      std::printf("tp %d rank %d, %s, %s: largest difference / bound %.3g\n", tp, comm.rank(),
                  c10::toString(dtype), what.c_str(), worst);
    }
  }
}

TEST(TensorParallelGpt, Tp2ComputesWhatTpOneComputes) {
  RunOnRanks(
      2,
      [](Communicator& comm) {
        at::set_num_threads(1);
        for (const GptConfig& c : {GqaConfig(), MhaTiedConfig()}) CompareWithTpOne(comm, c);
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(240)));
}

TEST(TensorParallelGpt, Tp4ComputesWhatTpOneComputes) {
  RunOnRanks(
      4,
      [](Communicator& comm) {
        at::set_num_threads(1);
        CompareWithTpOne(comm, WideConfig());
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(240)));
}

// Mixed precision (bf16 params and activations, the cross entropy in fp32) at tp 2: the bf16
// all-reduces run, and the logits, loss and gradients are held to the bf16 tp-1 model's own
// rounding error as the fp32 ones are (kFp32EstimateFactor x max |tp1_bf16 - tp1_fp64|, with the
// floor at 4 bf16 ulps, 4 x 2^-8, of the tensor's largest element).
TEST(TensorParallelGpt, Bf16Tp2StaysWithinTheTpOneModelsRounding) {
  RunOnRanks(
      2,
      [](Communicator& comm) {
        at::set_num_threads(1);
        const GptConfig c = GqaConfig();
        const at::Tensor tokens = Ids(3, c.max_seq_len, c.vocab_size, 31);
        const at::Tensor targets = Ids(3, c.max_seq_len, c.vocab_size, 32);
        ASSERT_OK_AND_ASSIGN(const Gpt reference, Gpt::Create(c, 4, at::kDouble));
        ASSERT_OK_AND_ASSIGN(const Gpt whole, Gpt::Create(c, 4, at::kBFloat16));
        ASSERT_OK_AND_ASSIGN(const Gpt part, Gpt::Create(c, 4, at::kBFloat16, at::kCPU, {},
                                                         TensorParallel{&comm}));
        constexpr double kBf16FloorUlps = 4.0 / 256.0;
        double worst = 0;
        auto check = [&](const std::string& name, const at::Tensor& got, const at::Tensor& tp1,
                         const at::Tensor& ref) {
          const double allowed =
              std::max(kFp32EstimateFactor * RelDiff(tp1, ref), kBf16FloorUlps);
          const double diff = RelDiff(got, tp1);
          worst = std::max(worst, diff / allowed);
          EXPECT_LE(diff, allowed) << name << " on tp rank " << comm.rank();
        };
        ASSERT_OK_AND_ASSIGN(const at::Tensor ref_logits, reference.Forward(tokens));
        ASSERT_OK_AND_ASSIGN(const at::Tensor local_logits, part.Forward(tokens));
        ASSERT_OK_AND_ASSIGN(const at::Tensor whole_logits, whole.Forward(tokens));
        check("logits", GatherVocab(comm, local_logits), whole_logits, ref_logits);
        ASSERT_OK_AND_ASSIGN(const at::Tensor ref_loss, reference.Loss(tokens, targets));
        ASSERT_OK_AND_ASSIGN(const at::Tensor part_loss, part.Loss(tokens, targets));
        ASSERT_OK_AND_ASSIGN(const at::Tensor whole_loss, whole.Loss(tokens, targets));
        EXPECT_EQ(part_loss.scalar_type(), at::kFloat);
        check("loss", part_loss, whole_loss, ref_loss);
        ref_loss.backward();
        part_loss.backward();
        whole_loss.backward();
        ASSERT_OK(part.TakeCollectiveError());
        const std::map<std::string, const ModelParam*> tp1 = ByName(whole), ref = ByName(reference);
        for (const ModelParam& p : part.params()) {
          ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
          EXPECT_EQ(p.tensor.grad().scalar_type(), at::kBFloat16) << p.name;
          check(p.name + " gradient", p.tensor.grad(), TpSlice(tp1.at(p.name)->tensor.grad(), p.tp),
                TpSlice(ref.at(p.name)->tensor.grad(), p.tp));
        }
        std::printf("bf16 tp 2 rank %d: largest difference / bound %.3g\n", comm.rank(), worst);
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(120)));
}

// The max-logit record at tp 2: each rank writes only its own heads (the others stay -inf), and
// those are the tp-1 record's within the fp64 bound (the same q and k up to the reordering above;
// the logits' products are the same per element).
TEST(TensorParallelGpt, MaxLogitRecordGetsThisRanksHeads) {
  RunOnRanks(
      2,
      [](Communicator& comm) {
        at::set_num_threads(1);
        const GptConfig c = GqaConfig();
        ASSERT_OK_AND_ASSIGN(Gpt whole, Gpt::Create(c, 3, at::kDouble));
        ASSERT_OK_AND_ASSIGN(Gpt part, Gpt::Create(c, 3, at::kDouble, at::kCPU, {},
                                                   TensorParallel{&comm}));
        const float inf = std::numeric_limits<float>::infinity();
        at::Tensor whole_record = at::full({c.num_layers, c.num_heads}, -inf);
        at::Tensor part_record = at::full({c.num_layers, c.num_heads}, -inf);
        whole.set_max_logit_record(whole_record);
        part.set_max_logit_record(part_record);
        const at::Tensor tokens = Ids(2, c.max_seq_len, c.vocab_size, 5);
        ASSERT_OK(whole.Forward(tokens).status());
        ASSERT_OK(part.Forward(tokens).status());
        const int64_t heads = c.num_heads / 2, own = comm.rank() * heads;
        const at::Tensor mine = part_record.narrow(1, own, heads);
        const at::Tensor others = part_record.narrow(1, heads - own, heads);
        EXPECT_TRUE(others.eq(-inf).all().item<bool>()) << part_record;
        EXPECT_TRUE(mine.isfinite().all().item<bool>()) << part_record;
        // fp32 record of fp64 logits: the rounding to fp32 dominates; within 2 fp32 ulps.
        EXPECT_LE(RelDiff(mine, whole_record.narrow(1, own, heads)), 2 * 5.9604644775390625e-8)
            << part_record << whole_record;
      },
      collectives::testing::WithTimeouts(absl::Seconds(60), absl::Seconds(120)));
}

// ---- a rank that does not take part -----------------------------------------------------------

// Rank 1 builds the model and then skips the forward (first launch) or the backward (second):
// rank 0's Forward, or its backward with TakeCollectiveError, fails within the communicator's
// timeout with a status naming the tp collective; nothing crashes, rank 1 ends normally.
TEST(TensorParallelGpt, ARankThatDoesNotTakePartFailsTheCollectiveNamingIt) {
  for (const bool in_backward : {false, true}) {
    const collectives::testing::MultiRankOutcome outcome = LaunchOnRanks(
        2,
        [in_backward](Communicator& comm) {
          at::set_num_threads(1);
          const GptConfig c = GqaConfig();
          ASSERT_OK_AND_ASSIGN(const Gpt part, Gpt::Create(c, 3, at::kFloat, at::kCPU, {},
                                                           TensorParallel{&comm}));
          const at::Tensor tokens = Ids(2, 8, c.vocab_size, 9);
          if (comm.rank() == 1) {
            if (in_backward) ASSERT_OK(part.Loss(tokens, tokens).status());
            absl::SleepFor(comm.timeout() + absl::Seconds(5));
            return;
          }
          if (!in_backward) {
            const absl::Status lost = part.Forward(tokens).status();
            std::printf("forward without rank 1: %s\n", lost.ToString().c_str());
            EXPECT_THAT(lost.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                           absl::StatusCode::kUnavailable))
                << lost;
            EXPECT_THAT(lost.message(),
                        HasSubstr("tp vocab-parallel embedding (sum all-reduce) on tp rank 0 "
                                  "of 2"));
            EXPECT_OK(part.TakeCollectiveError());  // Forward returned it: nothing left
            return;
          }
          ASSERT_OK_AND_ASSIGN(const at::Tensor loss, part.Loss(tokens, tokens));
          EXPECT_THROW(loss.backward(), c10::Error);
          const absl::Status error = part.TakeCollectiveError();
          std::printf("backward without rank 1: %s\n", error.ToString().c_str());
          EXPECT_THAT(error.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                          absl::StatusCode::kUnavailable))
              << error;
          EXPECT_THAT(error.message(),
                      HasSubstr("tp copy-to-tp-region (backward) (sum all-reduce) on tp rank 0 "
                                "of 2"));
          EXPECT_OK(part.TakeCollectiveError());  // taken
        },
        collectives::testing::WithTimeouts(absl::Seconds(3), absl::Seconds(120)));
    if (collectives::testing::InRankProcess()) continue;  // the other launch's rank process
    EXPECT_TRUE(outcome.passed[0]) << outcome.Transcript();
    EXPECT_TRUE(outcome.passed[1]) << outcome.Transcript();
  }
}

}  // namespace
}  // namespace orthoshard::model
