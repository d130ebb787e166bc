// How tensor parallelism splits one parameter (Megatron-LM's layout), as plain shape arithmetic:
// no tensors, so layout/ (planning), model/ (the parallel layers), optimizers/ (Newton–Schulz of
// a split matrix), checkpoint/ (records of TP slices) and export all read the same description.
//
// A split param's global tensor is `parts` equal runs along `dim`; each run is cut into `size`
// equal slices, and tp rank r holds slice r of every run, concatenated in run order:
//
//   QKV [(H + 2 KV) D, C], dim 0, parts 1: the KV groups are contiguous rows, so rank r holds
//       groups [r KV / tp, (r + 1) KV / tp) whole (column-parallel).
//   fc1 [2 F, C], dim 0, parts 2: rank r holds gate rows [r F/tp, (r+1) F/tp) then the same up
//       rows, so its SwiGLU pairs gate and up of the same hidden units (column-parallel).
//   proj [C, H D], fc2 [C, F]: dim 1, parts 1 (row-parallel).
//   embedding / output layer [V, C]: dim 0, parts 1 (vocab-parallel).
//   norms, router: dim -1 (replicated: every tp rank holds the whole tensor).
#ifndef ORTHOSHARD_COMMON_TP_SPLIT_H_
#define ORTHOSHARD_COMMON_TP_SPLIT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace orthoshard {

struct TpSplit {
  int dim = -1;        // -1: replicated over the tp group; else the split dimension (0 or 1)
  int64_t parts = 1;   // equal runs along dim, each split evenly over the tp ranks
  int size = 1;        // tp ranks the param is split over
  int rank = 0;        // this rank's slice, in [0, size)

  // Split over more than one rank (a replicated param, or any param at tp 1, is not).
  bool split() const { return dim >= 0 && size > 1; }
  // The same split held by tp rank `r`.
  TpSplit ForRank(int r) const {
    TpSplit s = *this;
    s.rank = r;
    return s;
  }
  std::string ToString() const;  // "replicated", or "dim 0, 2 parts, rank 1 of 2"
};

// OK when a tensor of global shape `global_shape` can be split as `split` says: dim within the
// shape, parts >= 1, 0 <= rank < size, and the extent along dim divisible by parts * size.
// Errors: kInvalidArgument naming `what` (e.g. a param's name) and the rule broken.
absl::Status ValidateTpSplit(const std::vector<int64_t>& global_shape, const TpSplit& split,
                             const std::string& what);

// The local shape of a global one (dim's extent divided by size), and back.
std::vector<int64_t> TpLocalShape(std::vector<int64_t> global_shape, const TpSplit& split);
std::vector<int64_t> TpGlobalShape(std::vector<int64_t> local_shape, const TpSplit& split);

// The [begin, end) runs along split.dim of the global tensor that split.rank holds, in the order
// its local tensor stores them (one per part). `global_extent` is the global size along dim.
// Replicated (or size 1): the one run [0, global_extent).
std::vector<std::pair<int64_t, int64_t>> TpRuns(int64_t global_extent, const TpSplit& split);

}  // namespace orthoshard

#endif  // ORTHOSHARD_COMMON_TP_SPLIT_H_
