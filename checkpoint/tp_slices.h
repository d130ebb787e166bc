// Tensor-parallel slices in checkpoints, as byte arithmetic (no LibTorch, so the `ckpt` tool uses
// it too): which records hold a param's whole tensor or its tp slices, and copying the elements
// two slices share.
//
// A run with tensor parallelism saves a tp-split param (common/tp_split.h: TpSplit::split()) as one
// record per tp rank, kind TpParamKind(rank) = "param@tp<rank>", each with a TpSlice (the saving
// split and the whole shape) and the slice's own shape; a replicated param is saved once, kind
// "param", as without tensor parallelism. The elementwise optimizer state of a split param
// (exp_avg, exp_avg_sq, momentum_buffer, main_param: the param's local shape) is saved as pieces of
// each tp rank's local state tensor, each piece carrying the same TpSlice. A reader at any tp size
// assembles what it needs from the slices that overlap it.
#ifndef ORTHOSHARD_CHECKPOINT_TP_SLICES_H_
#define ORTHOSHARD_CHECKPOINT_TP_SLICES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/manifest.pb.h"
#include "common/tp_split.h"

namespace orthoshard::checkpoint {

// TensorRecord.kind of tp rank `tp_rank`'s slice of a split param: "param@tp<tp_rank>".
std::string TpParamKind(int tp_rank);
// Whether `kind` is a param record's: kParamKind or a TpParamKind.
bool IsParamKind(absl::string_view kind);

// The split a record was saved with (replicated when it has no TpSlice), and the shape of the
// whole tensor it is part of (its TpSlice's whole_shape, else its own shape).
TpSplit SplitOf(const TensorRecord& record);
std::vector<int64_t> WholeShapeOf(const TensorRecord& record);
// The TpSlice of `split` for a tensor of whole shape `whole_shape`.
TpSlice MakeTpSlice(const TpSplit& split, absl::Span<const int64_t> whole_shape);

// Elements of a tensor of whole shape `whole_shape` that both a rank holding `a` and one holding
// `b` hold (each a TpSplit of that shape, ValidateTpSplit-valid; replicated: every element).
int64_t TpOverlapElements(const TpSplit& a, const TpSplit& b,
                          absl::Span<const int64_t> whole_shape);

// Copies, from `src` (the little-endian C-order local tensor of a rank holding `src_split`) into
// `dst` (the local tensor of a rank holding `dst_split`), every element both hold, each at its own
// local position; returns how many elements it copied. Both of the same dtype, `elem_bytes` per
// element. Preconditions (asserted): both splits valid for `whole_shape` and the spans exactly
// their local tensors' bytes.
int64_t CopyTpOverlap(absl::Span<const uint8_t> src, const TpSplit& src_split,
                      absl::Span<uint8_t> dst, const TpSplit& dst_split,
                      absl::Span<const int64_t> whole_shape, uint64_t elem_bytes);

// One param of a checkpoint as a whole tensor: the record holding it whole, or its tp slices.
struct WholeParam {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;                 // the whole tensor's
  TpSplit split;                              // the saving split (rank 0's); replicated if whole
  std::vector<const TensorRecord*> records;   // one whole record, or slice r at index r
  uint64_t bytes = 0;                         // of the whole tensor
};

// Every param of `manifest`, in the order of their first records, checked: a param is saved either
// whole or as slices of one split (same dtype, whole shape, dim, parts and size, each slice's
// shape its local shape) for every tp rank exactly once. `source` names the checkpoint in errors.
// Errors: kDataLoss "checkpoint <source>: param '<name>' is split over tp 2 (dim 0, ...) but no
// record holds its slice for tp rank 1" for a missing slice; kDataLoss naming the param and what
// disagrees for anything else (a slice and a whole record, two splits, a bad shape).
absl::StatusOr<std::vector<WholeParam>> WholeParams(const Manifest& manifest,
                                                    absl::string_view source);

// Reads the whole tensor of `param` into `out` (exactly param.bytes), reading each record with
// `read` (which must fill the span with the record's `length` bytes, checked). Errors: those of
// `read`; kInvalidArgument for a wrong `out` size; kDataLoss when the slices leave elements out.
absl::Status ReadWholeParam(
    const WholeParam& param,
    const std::function<absl::Status(const TensorRecord&, absl::Span<uint8_t>)>& read,
    absl::Span<uint8_t> out);

}  // namespace orthoshard::checkpoint

#endif  // ORTHOSHARD_CHECKPOINT_TP_SLICES_H_
