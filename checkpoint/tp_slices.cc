#include "checkpoint/tp_slices.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint {
namespace {

constexpr char kTpParamPrefix[] = "param@tp";

int64_t NumelOf(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One box of the elements a split holds: along `dim` the global run [begin, end), stored from
// local index `local_begin`; every other dimension whole. dim -1: the whole tensor.
struct Box {
  int dim = -1;
  int64_t begin = 0, end = 0, local_begin = 0;
};

std::vector<Box> BoxesOf(const TpSplit& split, absl::Span<const int64_t> whole_shape) {
  if (!split.split()) return {Box{}};
  std::vector<Box> boxes;
  int64_t local = 0;
  for (const auto& [b, e] : TpRuns(whole_shape[split.dim], split)) {
    boxes.push_back({split.dim, b, e, local});
    local += e - b;
  }
  return boxes;
}

// The intersection of boxes a and b as per-dimension [lo, hi), or false when empty.
bool Intersect(const Box& a, const Box& b, absl::Span<const int64_t> whole_shape,
               std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  const size_t n = whole_shape.size();
  lo.assign(n, 0);
  hi.assign(whole_shape.begin(), whole_shape.end());
  for (const Box* box : {&a, &b}) {
    if (box->dim < 0) continue;
    lo[box->dim] = std::max(lo[box->dim], box->begin);
    hi[box->dim] = std::min(hi[box->dim], box->end);
  }
  for (size_t k = 0; k < n; ++k) {
    if (lo[k] >= hi[k]) return false;
  }
  return true;
}

// Row-major strides (in elements) of `shape`.
std::vector<int64_t> Strides(absl::Span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int k = static_cast<int>(shape.size()) - 2; k >= 0; --k) s[k] = s[k + 1] * shape[k + 1];
  return s;
}

absl::Status SliceError(absl::string_view source, absl::string_view name, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", source, ": param '", name, "' ", what));
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace

std::string TpParamKind(int tp_rank) { return absl::StrCat(kTpParamPrefix, tp_rank); }

bool IsParamKind(absl::string_view kind) {
  return kind == kParamKind || absl::StartsWith(kind, kTpParamPrefix);
}

TpSplit SplitOf(const TensorRecord& record) {
  TpSplit s;
  if (!record.has_tp()) return s;
  s.dim = record.tp().dim();
  s.parts = record.tp().parts();
  s.size = record.tp().size();
  s.rank = record.tp().rank();
  return s;
}

std::vector<int64_t> WholeShapeOf(const TensorRecord& record) {
  if (record.has_tp()) return {record.tp().whole_shape().begin(), record.tp().whole_shape().end()};
  return {record.global_shape().begin(), record.global_shape().end()};
}

TpSlice MakeTpSlice(const TpSplit& split, absl::Span<const int64_t> whole_shape) {
  TpSlice t;
  t.set_dim(split.dim);
  t.set_parts(split.parts);
  t.set_size(split.size);
  t.set_rank(split.rank);
  for (int64_t d : whole_shape) t.add_whole_shape(d);
  return t;
}

int64_t TpOverlapElements(const TpSplit& a, const TpSplit& b,
                          absl::Span<const int64_t> whole_shape) {
  int64_t total = 0;
  std::vector<int64_t> lo, hi;
  for (const Box& x : BoxesOf(a, whole_shape)) {
    for (const Box& y : BoxesOf(b, whole_shape)) {
      if (!Intersect(x, y, whole_shape, lo, hi)) continue;
      int64_t n = 1;
      for (size_t k = 0; k < lo.size(); ++k) n *= hi[k] - lo[k];
      total += n;
    }
  }
  return total;
}

int64_t CopyTpOverlap(absl::Span<const uint8_t> src, const TpSplit& src_split,
                      absl::Span<uint8_t> dst, const TpSplit& dst_split,
                      absl::Span<const int64_t> whole_shape, uint64_t elem_bytes) {
  const std::vector<int64_t> src_shape =
      TpLocalShape({whole_shape.begin(), whole_shape.end()},
                   src_split.split() ? src_split : TpSplit{});
  const std::vector<int64_t> dst_shape =
      TpLocalShape({whole_shape.begin(), whole_shape.end()},
                   dst_split.split() ? dst_split : TpSplit{});
  assert(src.size() == static_cast<uint64_t>(NumelOf(src_shape)) * elem_bytes);
  assert(dst.size() == static_cast<uint64_t>(NumelOf(dst_shape)) * elem_bytes);
  const size_t n = whole_shape.size();
  if (n == 0) {  // a scalar: both hold it
    std::memcpy(dst.data(), src.data(), elem_bytes);
    return 1;
  }
  const std::vector<int64_t> src_strides = Strides(src_shape), dst_strides = Strides(dst_shape);
  int64_t copied = 0;
  std::vector<int64_t> lo, hi, index;
  for (const Box& s : BoxesOf(src_split, whole_shape)) {
    for (const Box& d : BoxesOf(dst_split, whole_shape)) {
      if (!Intersect(s, d, whole_shape, lo, hi)) continue;
      // Global index g along a box's dim sits at local g - begin + local_begin.
      std::vector<int64_t> src_shift(n, 0), dst_shift(n, 0);
      if (s.dim >= 0) src_shift[s.dim] = s.local_begin - s.begin;
      if (d.dim >= 0) dst_shift[d.dim] = d.local_begin - d.begin;
      const int64_t run = hi[n - 1] - lo[n - 1];  // contiguous along the last dimension
      index = lo;
      while (true) {
        int64_t so = 0, dof = 0;
        for (size_t k = 0; k < n; ++k) {
          so += (index[k] + src_shift[k]) * src_strides[k];
          dof += (index[k] + dst_shift[k]) * dst_strides[k];
        }
        std::memcpy(dst.data() + dof * elem_bytes, src.data() + so * elem_bytes, run * elem_bytes);
        copied += run;
        int k = static_cast<int>(n) - 2;  // odometer over every dimension but the last
        while (k >= 0 && ++index[k] == hi[k]) {
          index[k] = lo[k];
          --k;
        }
        if (k < 0) break;
      }
    }
  }
  return copied;
}

absl::StatusOr<std::vector<WholeParam>> WholeParams(const Manifest& manifest,
                                                    absl::string_view source) {
  std::vector<WholeParam> params;
  std::map<std::string, size_t> index;
  for (const TensorRecord& r : manifest.tensors()) {
    if (!IsParamKind(r.kind())) continue;
    const auto [it, fresh] = index.emplace(r.name(), params.size());
    if (fresh) params.push_back({r.name(), r.dtype(), WholeShapeOf(r), SplitOf(r).ForRank(0), {}});
    WholeParam& p = params[it->second];
    const bool whole = r.kind() == kParamKind;
    if (whole != !r.has_tp()) {
      return SliceError(source, r.name(), absl::StrCat("has record kind '", r.kind(), "' ",
                                                       whole ? "with" : "without",
                                                       " a tp slice"));
    }
    const TpSplit split = SplitOf(r);
    const std::vector<int64_t> whole_shape = WholeShapeOf(r);
    if (r.dtype() != p.dtype || whole_shape != p.shape || split.ForRank(0).dim != p.split.dim ||
        split.parts != p.split.parts || split.size != p.split.size) {
      return SliceError(source, r.name(),
                        absl::StrCat("has records of different dtypes, shapes or splits (",
                                     p.dtype, " ", ShapeText(p.shape), " ", p.split.ToString(),
                                     " vs ", r.kind(), ": ", r.dtype(), " ",
                                     ShapeText(whole_shape), " ", split.ToString(), ")"));
    }
    if (whole) {
      if (!p.records.empty()) return SliceError(source, r.name(), "is saved twice");
      p.records.push_back(&r);
      continue;
    }
    if (absl::Status s = ValidateTpSplit(p.shape, split, absl::StrCat("param '", r.name(), "'"));
        !s.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", source, ": ", s.message()));
    }
    const std::vector<int64_t> local = TpLocalShape(p.shape, split);
    if (!std::equal(r.global_shape().begin(), r.global_shape().end(), local.begin(),
                    local.end()) ||
        r.kind() != TpParamKind(split.rank)) {
      return SliceError(source, r.name(),
                        absl::StrCat("slice ", r.kind(), " has shape ",
                                     ShapeText(absl::MakeConstSpan(r.global_shape().data(),
                                                                   r.global_shape().size())),
                                     ", its split (", split.ToString(), ") gives ",
                                     ShapeText(local)));
    }
    p.records.resize(split.size, nullptr);
    if (p.records[split.rank] != nullptr) {
      return SliceError(source, r.name(), absl::StrCat("has two slices for tp rank ", split.rank));
    }
    p.records[split.rank] = &r;
  }
  for (WholeParam& p : params) {
    for (size_t rank = 0; rank < p.records.size(); ++rank) {
      if (p.records[rank] == nullptr) {
        return SliceError(source, p.name,
                          absl::StrCat("is split over tp ", p.split.size, " (",
                                       p.split.ToString(), ") but no record holds its slice for "
                                       "tp rank ", rank));
      }
    }
    ASSIGN_OR_RETURN(p.bytes, TensorByteSize({p.name, p.dtype, p.shape}));
  }
  return params;
}

absl::Status ReadWholeParam(
    const WholeParam& param,
    const std::function<absl::Status(const TensorRecord&, absl::Span<uint8_t>)>& read,
    absl::Span<uint8_t> out) {
  if (out.size() != param.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "' has ", param.bytes,
                                                   " bytes whole, the buffer ", out.size()));
  }
  if (param.records.size() == 1 && !param.records[0]->has_tp()) return read(*param.records[0], out);
  ASSIGN_OR_RETURN(const uint64_t elem, SafetensorsDTypeSize(param.dtype));
  std::vector<uint8_t> slice;
  int64_t covered = 0;
  for (const TensorRecord* r : param.records) {
    slice.resize(r->length());
    RETURN_IF_ERROR(read(*r, absl::MakeSpan(slice)));
    covered += CopyTpOverlap(slice, SplitOf(*r), out, TpSplit{}, param.shape, elem);
  }
  if (covered != NumelOf(param.shape)) {
    return absl::DataLossError(absl::StrCat("param '", param.name, "': its tp slices hold ",
                                            covered, " of its ", NumelOf(param.shape),
                                            " elements"));
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::checkpoint
