// Tensor parallelism of the GPT (Megatron-LM's layout): which tp group a model is split over, and
// the autograd functions of its parallel layers, each running collectives of the tp group's
// Communicator. How each param is split is its ModelParam::tp (common/tp_split.h).
//
//   CopyToTpRegion        forward identity            backward all-reduce (sum) of the gradient
//   ReduceFromTpRegion    forward all-reduce (sum)    backward identity
//   VocabParallelEmbedding   rows of the rank's vocabulary slice, zero rows for other ids, then
//                            ReduceFromTpRegion: every rank gets the whole embedding output
//   VocabParallelCrossEntropy   cross entropy over vocab-local logits, no gather of the logits:
//                            one max all-reduce, one sum all-reduce (sum of exp and target logit)
//
// A column-parallel linear (QKV, fc1) takes CopyToTpRegion of its replicated input and yields
// this rank's output columns; a row-parallel linear (proj, fc2) takes those local columns and
// ReduceFromTpRegion of its output is the whole (replicated) result.
//
// Cross-rank contract: every rank of the tp group calls the same functions on tensors of the same
// shapes in the same order, in forward and (for CopyToTpRegion and the cross entropy) in backward;
// they are collectives. With a tp group of size 1 (or none) they are the plain local ops and run
// no collective. A failed collective (a rank that does not take part within the communicator's
// timeout, a dead peer) is kept in *error (the first one; the caller's slot, which must outlive
// the autograd graph) and thrown as a c10::Error carrying its message, since a failure inside
// backward can only surface as LibTorch's exception text; Gpt::TakeCollectiveError returns it.
#ifndef ORTHOSHARD_MODEL_TENSOR_PARALLEL_H_
#define ORTHOSHARD_MODEL_TENSOR_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "common/tp_split.h"

namespace orthoshard::model {

struct TensorParallel {
  collectives::Communicator* comm = nullptr;  // the tp group; null: the whole model on this rank

  int rank() const { return comm != nullptr ? comm->rank() : 0; }
  int size() const { return comm != nullptr ? comm->size() : 1; }
};

// This rank's slice of a global tensor as `split` describes it (TpRuns along split.dim,
// concatenated in run order): a new contiguous tensor of TpLocalShape. Replicated: a contiguous
// copy of the whole. Precondition: ValidateTpSplit(global's shape, split) is OK.
at::Tensor TpSlice(const at::Tensor& global, const TpSplit& split);

// x unchanged in forward; its gradient summed over the tp group in backward. Differentiable.
at::Tensor CopyToTpRegion(const at::Tensor& x, const TensorParallel& tp, absl::Status* error);

// x summed over the tp group in forward (a new tensor; x is not modified); the gradient passed
// through unchanged in backward. Differentiable.
at::Tensor ReduceFromTpRegion(const at::Tensor& x, const TensorParallel& tp, absl::Status* error);

// The embedding of ids [..] (int64, global vocabulary ids in [0, V)) with the rank's rows
// `weight` [V / tp, C] of the global table, which hold ids [vocab_begin, vocab_begin + V / tp):
// [.., C], the whole embedding on every rank (ids of other ranks' slices give zero rows here,
// and the sum over the group fills them in; each output row is one nonzero row plus zeros, so it
// equals the unsplit embedding bitwise). Differentiable in weight.
at::Tensor VocabParallelEmbedding(const at::Tensor& weight, const at::Tensor& ids,
                                  int64_t vocab_begin, const TensorParallel& tp,
                                  absl::Status* error);

// The per-token cross entropy (nats) of logits [N, V / tp] (this rank's vocabulary columns
// [vocab_begin, vocab_begin + V / tp) of the whole [N, V] logits; fp32 or fp64, computed in that
// dtype) against targets [N] (int64 global ids, or `ignored` for a token that is not counted):
// [N] in the logits' dtype, the same on every rank, 0 at ignored tokens:
//   loss_n = log sum_v exp(z_nv - m_n) - (z_n,t_n - m_n),  m_n = max_v z_nv over the whole row
// (one max all-reduce of m, one sum all-reduce of the local sums of exp and the target logit).
// Backward: grad_n (softmax(z_n) - onehot(t_n)) on this rank's columns, 0 for ignored tokens.
// Differentiable in logits.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t vocab_begin, int64_t ignored,
                                     const TensorParallel& tp, absl::Status* error);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_TENSOR_PARALLEL_H_
