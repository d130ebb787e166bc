// Attention per document segment (Documents::attention kSegments, model/document_attention.h)
// against the dense-mask path (kMask): the same losses and param gradients within bounds derived
// from each dtype's unit roundoff, rows of 1, 2 and many documents (of length 1 too), rows that
// share a segmentation (grouped, reordered), a batch without boundaries, grouped-query attention.
#include "model/document_attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/qk_clip.h"

namespace orthoshard::model {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kT = 32;

GptConfig Config(int64_t kv_heads) {
  GptConfig c;
  c.vocab_size = 29;
  c.max_seq_len = kT;
  c.num_layers = 2;
  c.hidden = 16;
  c.num_heads = 4;
  c.num_kv_heads = kv_heads;
  c.ffn_hidden = 24;
  c.init_std = 0.3;  // large enough that attention weights are far from uniform
  return c;
}

// Segment ids and positions [rows, kT] of rows given as document lengths (each summing to kT).
Documents MakeDocuments(const std::vector<std::vector<int64_t>>& rows, DocumentAttention how) {
  std::vector<int64_t> segments, positions;
  for (const std::vector<int64_t>& lengths : rows) {
    for (size_t d = 0; d < lengths.size(); ++d) {
      for (int64_t p = 0; p < lengths[d]; ++p) {
        segments.push_back(static_cast<int64_t>(d));
        positions.push_back(p);
      }
    }
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong);
  return {at::tensor(segments, longs).view({B, kT}), at::tensor(positions, longs).view({B, kT}),
          how};
}

// Rows of one (twice, not adjacent), two (twice, not adjacent) and many documents, lengths 1
// among them.
const std::vector<std::vector<int64_t>> kRows = {
    {32}, {13, 19}, {1, 5, 1, 1, 9, 3, 12}, {13, 19}, {32}, {1, 30, 1}};

at::Tensor Tokens(int64_t b, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, kT}, gen, at::TensorOptions().dtype(at::kLong));
}

struct LossAndGrads {
  double loss = 0;
  at::Tensor grads;  // every param's gradient, flattened and concatenated, in fp64
};

LossAndGrads Backward(const Gpt& model, const at::Tensor& tokens, const Documents& documents) {
  const at::Tensor targets = tokens.roll(-1, 1);
  at::Tensor loss = model.Loss(tokens, targets, &documents).value();
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const ModelParam& p : model.params()) {
    grads.push_back(p.tensor.grad().to(at::kDouble).reshape({-1}));
    p.tensor.mutable_grad().reset();
  }
  return {loss.item<double>(), at::cat(grads)};
}

double RelativeDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

// Error bound shared by the comparisons below. Every value of the loss and its gradients comes out
// of at most kDepth chained ops (forward: per block norm, qkv, rotary, attention, proj, norm,
// fc1, SwiGLU, fc2 = 9, so 2 * 9 + 4 for embedding, final norm, head and cross entropy = 22;
// backward at most twice as deep: 66 in all), each a sum of at most kTerms = max(T, C, F, V) = 32
// products. A sum of n terms in a precision of unit roundoff u is exact up to a relative gamma_n
// ~= n u (Higham, Accuracy and Stability, 3.1); the activations are RMS-normed and O(1) (init 0.3,
// a 16-wide model), so each op passes its input's relative error on with a factor O(1) and the
// errors add: relative (norm-wise) error <= kDepth * kTerms * u.
constexpr double kDepth = 66, kTerms = 32;
double Bound(double unit_roundoff) { return kDepth * kTerms * unit_roundoff; }

// fp64: the two paths run the same products in other kernel calls (the masked keys add exact
// zeros), so they agree within twice the bound of each against exact arithmetic.
TEST(DocumentAttention, SegmentsMatchMaskInFp64) {
  at::set_num_threads(1);
  const double u64 = std::numeric_limits<double>::epsilon() / 2;
  for (const int64_t kv : {4, 2, 1}) {  // MHA and grouped-query attention
    SCOPED_TRACE(kv);
    const Gpt model = Gpt::Create(Config(kv), 3, at::kDouble).value();
    const at::Tensor tokens = Tokens(kRows.size(), 29, 5);
    const LossAndGrads seg = Backward(model, tokens, MakeDocuments(kRows, DocumentAttention::kSegments));
    const LossAndGrads mask = Backward(model, tokens, MakeDocuments(kRows, DocumentAttention::kMask));
    EXPECT_LE(std::abs(seg.loss - mask.loss) / std::abs(mask.loss), 2 * Bound(u64));
    EXPECT_LE(RelativeDiff(seg.grads, mask.grads), 2 * Bound(u64));
    // Not vacuous: documents change the result (whole-row causal attention differs).
    const at::Tensor targets = tokens.roll(-1, 1);
    EXPECT_GT(std::abs(model.Loss(tokens, targets).value().item<double>() - mask.loss), 1e-6);
  }
}

// fp32 and bf16 against an fp64 model holding the same (exactly widened) params: both paths within
// the bound of their unit roundoff. bf16: ATen's CPU kernels accumulate in fp32 and round each
// op's output to bf16 once, so an op adds u_bf16 = 2^-8 (its fp32 sums' kTerms u_32 is 1000 times
// less): relative error <= kDepth * u_bf16 (+ kDepth * kTerms * u_32).
TEST(DocumentAttention, LowPrecisionAgainstFp64Reference) {
  at::set_num_threads(1);
  const GptConfig config = Config(2);
  const at::Tensor tokens = Tokens(kRows.size(), 29, 6);
  const double u32 = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -8);
  for (const auto& [dtype, bound] :
       {std::pair<at::ScalarType, double>{at::kFloat, Bound(u32)},
        std::pair<at::ScalarType, double>{at::kBFloat16, kDepth * u16 + Bound(u32)}}) {
    SCOPED_TRACE(c10::toString(dtype));
    const Gpt low = Gpt::Create(config, 4, dtype).value();
    const Gpt reference = Gpt::Create(config, 4, at::kDouble).value();
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < low.params().size(); ++i) {
        reference.params()[i].tensor.copy_(low.params()[i].tensor);
      }
    }
    const LossAndGrads exact =
        Backward(reference, tokens, MakeDocuments(kRows, DocumentAttention::kMask));
    for (const DocumentAttention how : {DocumentAttention::kSegments, DocumentAttention::kMask}) {
      SCOPED_TRACE(how == DocumentAttention::kMask ? "mask" : "segments");
      const LossAndGrads got = Backward(low, tokens, MakeDocuments(kRows, how));
      EXPECT_LE(std::abs(got.loss - exact.loss) / std::abs(exact.loss), bound);
      EXPECT_LE(RelativeDiff(got.grads, exact.grads), bound);
    }
  }
}

// Without a boundary in any row the segments path is plain causal attention: the same ops on the
// same values as a forward without documents, so bitwise equal.
TEST(DocumentAttention, NoBoundaryIsPlainCausal) {
  at::set_num_threads(1);
  const Gpt model = Gpt::Create(Config(2), 3, at::kFloat).value();
  const at::Tensor tokens = Tokens(3, 29, 7);
  const Documents whole = MakeDocuments({{32}, {32}, {32}}, DocumentAttention::kSegments);
  EXPECT_TRUE(PlanDocumentRuns(whole.segments).causal());
  EXPECT_TRUE(at::equal(model.Forward(tokens, &whole).value(), model.Forward(tokens).value()));
}

// Rows of equal lengths form one group, in order of first appearance; rows are reordered only
// when a group's rows are not adjacent.
TEST(DocumentAttention, PlanGroupsRowsOfEqualLengths) {
  const DocumentRuns runs =
      PlanDocumentRuns(MakeDocuments(kRows, DocumentAttention::kSegments).segments);
  EXPECT_FALSE(runs.causal());
  EXPECT_THAT(runs.group_rows, ElementsAre(2, 2, 1, 1));
  EXPECT_THAT(runs.group_lengths,
              ElementsAre(ElementsAre(32), ElementsAre(13, 19), ElementsAre(1, 5, 1, 1, 9, 3, 12),
                          ElementsAre(1, 30, 1)));
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong);
  EXPECT_TRUE(at::equal(runs.row_order, at::tensor(std::vector<int64_t>{0, 4, 1, 3, 2, 5}, longs)));
  EXPECT_TRUE(
      at::equal(runs.inverse_order, at::tensor(std::vector<int64_t>{0, 2, 4, 3, 1, 5}, longs)));

  const DocumentRuns adjacent = PlanDocumentRuns(
      MakeDocuments({{13, 19}, {13, 19}, {32}}, DocumentAttention::kSegments).segments);
  EXPECT_THAT(adjacent.group_rows, ElementsAre(2, 1));
  EXPECT_FALSE(adjacent.row_order.defined());
}

// QK-clip's measurement per document equals the masked one: the same D-term dot products (D = 8
// here) in other matmul shapes, so each logit within 2 gamma_D |q||k| ~= 2 D u64 |q||k|.
TEST(DocumentAttention, MaxLogitsPerDocumentMatchTheMask) {
  at::set_num_threads(1);
  const Documents docs = MakeDocuments(kRows, DocumentAttention::kSegments);
  const int64_t B = static_cast<int64_t>(kRows.size()), H = 4, KV = 2, D = 8;
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::randn({B, H, kT, D}, f64), k = at::randn({B, KV, kT, D}, f64);
  const at::Tensor got = DocumentMaxAttentionLogits(PlanDocumentRuns(docs.segments), q, k);
  const at::Tensor want = MaxAttentionLogits(q, k, DocumentMask(docs.segments));
  // Computed in fp32 (MaxAttentionLogits' contract): u32 instead, |q||k| / sqrt(D) <= 30 for
  // standard normal entries of 8-vectors (norms below 5.5 with overwhelming probability).
  const double bound = 2 * D * std::ldexp(1.0, -24) * 30;
  EXPECT_LE((got - want).abs().max().item<double>(), bound);
}

TEST(DocumentAttention, DecreasingSegmentsAreRefused) {
  const Gpt model = Gpt::Create(Config(2), 3).value();
  Documents docs = MakeDocuments({{16, 16}}, DocumentAttention::kSegments);
  docs.segments[0][20] = 0;
  EXPECT_THAT(model.Forward(Tokens(1, 29, 1), &docs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("documents' segments must be non-decreasing")));
}

}  // namespace
}  // namespace orthoshard::model
