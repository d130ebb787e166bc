// tp_slices: copying between tensor-parallel slices at different tp sizes, checked element by
// element against TpRuns' definition of what a rank holds, and WholeParams' checks of a manifest.
#include "checkpoint/tp_slices.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "common/testing/status_matchers.h"
#include "common/tp_split.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TpSplit Split(int dim, int64_t parts, int size, int rank) {
  TpSplit s;
  s.dim = dim;
  s.parts = parts;
  s.size = size;
  s.rank = rank;
  return s;
}

// The local tensor of `split` of the 2-D whole tensor whose element (i, j) is i * 100 + j, built
// from TpRuns alone.
std::vector<float> Local(int64_t rows, int64_t cols, const TpSplit& split) {
  std::vector<int64_t> row_index, col_index;
  for (int64_t i = 0; i < rows; ++i) row_index.push_back(i);
  for (int64_t j = 0; j < cols; ++j) col_index.push_back(j);
  if (split.split()) {
    std::vector<int64_t>& index = split.dim == 0 ? row_index : col_index;
    index.clear();
    for (const auto& [b, e] : TpRuns(split.dim == 0 ? rows : cols, split)) {
      for (int64_t k = b; k < e; ++k) index.push_back(k);
    }
  }
  std::vector<float> out;
  for (int64_t i : row_index) {
    for (int64_t j : col_index) out.push_back(static_cast<float>(i * 100 + j));
  }
  return out;
}

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}
absl::Span<uint8_t> MutableBytes(std::vector<float>& v) {
  return {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(float)};
}

// Every rank at tp `to` assembled from every rank at tp `from` equals its own local tensor, each
// element copied exactly once.
void ExpectReshards(int dim, int64_t parts, int from, int to) {
  const int64_t rows = 12, cols = 24;
  const std::vector<int64_t> whole = {rows, cols};
  for (int r = 0; r < to; ++r) {
    const TpSplit dst_split = Split(dim, parts, to, r);
    std::vector<float> dst(Local(rows, cols, dst_split).size(), -1.0f);
    int64_t copied = 0, overlap = 0;
    for (int s = 0; s < from; ++s) {
      const TpSplit src_split = Split(dim, parts, from, s);
      const std::vector<float> src = Local(rows, cols, src_split);
      overlap += TpOverlapElements(src_split, dst_split, whole);
      copied += CopyTpOverlap(Bytes(src), src_split, MutableBytes(dst), dst_split, whole,
                              sizeof(float));
    }
    SCOPED_TRACE(::testing::Message() << "dim " << dim << ", " << parts << " parts, tp " << from
                                    << " -> " << to << ", rank " << r);
    EXPECT_EQ(copied, static_cast<int64_t>(dst.size()));
    EXPECT_EQ(overlap, copied);
    EXPECT_EQ(dst, Local(rows, cols, dst_split));
  }
}

TEST(TpSlicesTest, CopiesBetweenAnyTpSizes) {
  for (int dim : {0, 1}) {
    for (int64_t parts : {1, 2}) {
      for (int from : {1, 2, 3}) {
        for (int to : {1, 2, 3, 6}) ExpectReshards(dim, parts, from, to);
      }
    }
  }
}

TEST(TpSlicesTest, ReplicatedAndScalar) {
  const std::vector<float> src = {1, 2, 3, 4};
  std::vector<float> dst(4, 0);
  EXPECT_EQ(CopyTpOverlap(Bytes(src), TpSplit{}, MutableBytes(dst), TpSplit{}, {4}, 4), 4);
  EXPECT_EQ(dst, src);
  const std::vector<float> one = {7};
  std::vector<float> got = {0};
  EXPECT_EQ(CopyTpOverlap(Bytes(one), TpSplit{}, MutableBytes(got), TpSplit{}, {}, 4), 1);
  EXPECT_EQ(got, one);
}

TensorRecord Slice(const std::string& name, int rank, int size) {
  TensorRecord r;
  r.set_name(name);
  r.set_kind(TpParamKind(rank));
  r.set_dtype("F32");
  r.add_global_shape(8 / size);
  r.add_global_shape(4);
  r.set_length(8 / size * 4 * 4);
  *r.mutable_tp() = MakeTpSlice(Split(0, 1, size, rank), std::vector<int64_t>{8, 4});
  return r;
}

TEST(TpSlicesTest, WholeParamsChecksSlices) {
  Manifest m;
  *m.add_tensors() = Slice("w", 1, 2);
  *m.add_tensors() = Slice("w", 0, 2);
  ASSERT_OK_AND_ASSIGN(const std::vector<WholeParam> params, WholeParams(m, "ck"));
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(params[0].bytes, 8u * 4 * 4);
  EXPECT_EQ(params[0].records[0]->kind(), "param@tp0");
  EXPECT_EQ(params[0].records[1]->kind(), "param@tp1");

  Manifest missing;
  *missing.add_tensors() = Slice("w", 0, 2);
  EXPECT_THAT(WholeParams(missing, "ck"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("checkpoint ck: param 'w' is split over tp 2 (dim 0, 1 part, "
                                 "rank 0 of 2) but no record holds its slice for tp rank 1")));

  Manifest mixed = m;
  TensorRecord whole = Slice("w", 0, 1);
  whole.set_kind(kParamKind);
  whole.clear_tp();
  *mixed.add_tensors() = whole;
  EXPECT_THAT(WholeParams(mixed, "ck"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("param 'w' has records of different")));

  Manifest two_splits = missing;
  *two_splits.add_tensors() = Slice("w", 1, 4);
  EXPECT_THAT(WholeParams(two_splits, "ck"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("different dtypes, shapes or splits")));
}

}  // namespace
}  // namespace orthoshard::checkpoint
