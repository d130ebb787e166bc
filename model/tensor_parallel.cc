// The tensor-parallel autograd functions (tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/log.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace orthoshard::model {
namespace {

using collectives::Communicator;
using collectives::ReduceOp;

// In-place all-reduce of the contiguous `t` over `comm`, waited on with the communicator's
// timeout. A failure is kept in *error (the first one) and thrown.
void AllReduceOrThrow(Communicator* comm, at::Tensor& t, ReduceOp op, const std::string& what,
                      absl::Status* error) {
  absl::StatusOr<std::unique_ptr<collectives::Work>> work =
      comm->AllReduce(t, collectives::AllReduceOptions{op});
  absl::Status status = work.ok() ? (*work)->Wait(comm->timeout()) : work.status();
  if (status.ok()) return;
  status = absl::Status(status.code(), absl::StrCat("tp ", what, " (", ReduceOpName(op),
                                                    " all-reduce) on tp rank ", comm->rank(),
                                                    " of ", comm->size(), ": ", status.message()));
  if (error != nullptr && error->ok()) *error = status;
  TORCH_CHECK(false, status.ToString());
}

// The communicator and the error slot outlive every graph the model builds: kept in the
// autograd context as addresses (as moe.cc's AllToAllFunction does).
void Keep(torch::autograd::AutogradContext* ctx, Communicator* comm, absl::Status* error,
          const std::string& what) {
  ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
  ctx->saved_data["error"] = reinterpret_cast<int64_t>(error);
  ctx->saved_data["what"] = what;
}
Communicator* CommOf(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
}
absl::Status* ErrorOf(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<absl::Status*>(ctx->saved_data["error"].toInt());
}

struct CopyToTpFunction : public torch::autograd::Function<CopyToTpFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            Communicator* comm, absl::Status* error) {
    Keep(ctx, comm, error, "copy-to-tp-region (backward)");
    return x;  // autograd returns an input as a view of it with this function's history
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor grad = grads[0].contiguous().clone();
    AllReduceOrThrow(CommOf(ctx), grad, ReduceOp::kSum, ctx->saved_data["what"].toStringRef(),
                     ErrorOf(ctx));
    return {grad, at::Tensor(), at::Tensor()};
  }
};

struct ReduceFromTpFunction : public torch::autograd::Function<ReduceFromTpFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            Communicator* comm, absl::Status* error, const std::string& what) {
    at::Tensor sum = x.contiguous().clone();
    AllReduceOrThrow(comm, sum, ReduceOp::kSum, what, error);
    return sum;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// See VocabParallelCrossEntropy. Saves the local softmax [N, V / tp] (as Megatron-LM's
// _VocabParallelCrossEntropy), the target's local column and whether this rank holds it.
struct VocabParallelCrossEntropyFunction
    : public torch::autograd::Function<VocabParallelCrossEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t vocab_begin, int64_t ignored,
                            Communicator* comm, absl::Status* error) {
    Keep(ctx, comm, error, "");
    const int64_t local = logits.size(1);
    at::Tensor max = std::get<0>(logits.max(1)).contiguous();  // [N]
    if (comm != nullptr) AllReduceOrThrow(comm, max, ReduceOp::kMax, "cross entropy max", error);
    const at::Tensor shifted = logits - max.unsqueeze(1);  // <= 0
    const at::Tensor exp = shifted.exp();
    const at::Tensor held = targets.ge(vocab_begin).logical_and_(targets.lt(vocab_begin + local));
    const at::Tensor column = (targets - vocab_begin).masked_fill_(held.logical_not(), 0);  // [N]
    const at::Tensor target_logit =
        shifted.gather(1, column.unsqueeze(1)).squeeze(1).masked_fill_(held.logical_not(), 0);
    // [2, N]: sum of exp over the local columns; the target's shifted logit (0 where another
    // rank holds it). Summed over the group, both are the whole row's.
    at::Tensor sums = at::stack({exp.sum(1), target_logit});
    if (comm != nullptr) {
      AllReduceOrThrow(comm, sums, ReduceOp::kSum, "cross entropy sum of exp and target logit",
                       error);
    }
    const at::Tensor counted = targets.ne(ignored);
    const at::Tensor loss =
        (at::log(sums[0]) - sums[1]).masked_fill_(counted.logical_not(), 0);
    ctx->save_for_backward({exp / sums[0].unsqueeze(1), column, held.logical_and(counted),
                            counted});
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& column = saved[1];
    const at::Tensor& hot = saved[2];      // this rank holds a counted token's target
    const at::Tensor& counted = saved[3];
    // softmax - onehot, scaled by each token's gradient (0 for an ignored token).
    at::Tensor grad = softmax.clone();
    grad.scatter_add_(1, column.unsqueeze(1), hot.to(grad.scalar_type()).neg().unsqueeze(1));
    const at::Tensor scale = grads[0] * counted.to(grads[0].scalar_type());
    grad.mul_(scale.unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor TpSlice(const at::Tensor& global, const TpSplit& split) {
  if (!split.split()) return global.contiguous().clone();
  std::vector<at::Tensor> runs;
  for (const auto& [begin, end] : TpRuns(global.size(split.dim), split)) {
    runs.push_back(global.narrow(split.dim, begin, end - begin));
  }
  return runs.size() == 1 ? runs[0].contiguous().clone() : at::cat(runs, split.dim);
}

at::Tensor CopyToTpRegion(const at::Tensor& x, const TensorParallel& tp, absl::Status* error) {
  if (tp.size() == 1) return x;
  return CopyToTpFunction::apply(x, tp.comm, error);
}

at::Tensor ReduceFromTpRegion(const at::Tensor& x, const TensorParallel& tp, absl::Status* error) {
  if (tp.size() == 1) return x;
  return ReduceFromTpFunction::apply(x, tp.comm, error, std::string("reduce-from-tp-region"));
}

at::Tensor VocabParallelEmbedding(const at::Tensor& weight, const at::Tensor& ids,
                                  int64_t vocab_begin, const TensorParallel& tp,
                                  absl::Status* error) {
  if (tp.size() == 1) return at::embedding(weight, ids);
  const at::Tensor other = ids.lt(vocab_begin).logical_or_(ids.ge(vocab_begin + weight.size(0)));
  const at::Tensor local = (ids - vocab_begin).masked_fill_(other, 0);
  const at::Tensor rows = at::embedding(weight, local).masked_fill(other.unsqueeze(-1), 0);
  return ReduceFromTpFunction::apply(rows, tp.comm, error,
                                     std::string("vocab-parallel embedding"));
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t vocab_begin, int64_t ignored,
                                     const TensorParallel& tp, absl::Status* error) {
  return VocabParallelCrossEntropyFunction::apply(logits, targets, vocab_begin, ignored,
                                                  tp.size() == 1 ? nullptr : tp.comm, error);
}

}  // namespace orthoshard::model
