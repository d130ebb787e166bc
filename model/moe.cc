// MoeMlp (moe.h): routing, dispatch and combine by all-to-all, the experts, the auxiliary losses.
#include "model/moe.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/swiglu.h"

namespace orthoshard::model {
namespace {

using collectives::Communicator;

// Throws (as the model's other failures do) after keeping the first collective error.
[[noreturn]] void Fail(absl::Status* error, absl::Status status) {
  if (error != nullptr && error->ok()) *error = status;
  TORCH_CHECK(false, status.ToString());
  __builtin_unreachable();
}

// rows [sum(send), ...] -> [sum(recv), ...] over `comm`, waited on with the communicator's timeout.
at::Tensor ExchangeRows(Communicator* comm, const at::Tensor& input,
                        const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                        const char* what, absl::Status* error) {
  int64_t rows = 0;
  for (int64_t r : recv) rows += r;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = rows;
  at::Tensor output = at::empty(shape, input.options());
  const at::Tensor in = input.contiguous();
  absl::StatusOr<std::unique_ptr<collectives::Work>> work =
      comm->AllToAll(in, output, collectives::AllToAllOptions{send, recv});
  absl::Status status = work.ok() ? (*work)->Wait(comm->timeout()) : work.status();
  if (!status.ok()) {
    Fail(error, absl::Status(status.code(), absl::StrCat("moe ", what, " on ep rank ",
                                                         comm->rank(), " of ", comm->size(),
                                                         ": ", status.message())));
  }
  return output;
}

// The token all-to-all as an autograd function: its backward sends the gradients back along the
// same rows (the all-to-all with the splits swapped). The communicator and the error slot are the
// model's (they outlive every graph it builds), kept in the context as addresses.
struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            Communicator* comm, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, absl::Status* error,
                            const std::string& what) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    ctx->saved_data["error"] = reinterpret_cast<int64_t>(error);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["what"] = what;
    return ExchangeRows(comm, input, send, recv, what.c_str(), error);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    auto* error = reinterpret_cast<absl::Status*>(ctx->saved_data["error"].toInt());
    const std::string what = absl::StrCat(ctx->saved_data["what"].toStringRef(), " (backward)");
    // Gradients come back along the rows they went: the splits swapped.
    at::Tensor grad = ExchangeRows(comm, grads[0], ctx->saved_data["recv"].toIntVector(),
                                   ctx->saved_data["send"].toIntVector(), what.c_str(), error);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// One expert's SwiGLU over its rows x [n, C].
at::Tensor Expert(const at::Tensor& x, const at::Tensor& fc1, const at::Tensor& fc2) {
  return at::linear(SwiGluIn(x, fc1), fc2);
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The experts of this rank over `rows` (the token copies sorted by expert, this rank's counts per
// expert in `counts`, all E of them), returned in the same order: with ep > 1 dispatched to the
// experts' ranks and combined back.
at::Tensor RunExperts(const MoeWeights& w, const ExpertParallel& ep, const at::Tensor& rows,
                      const std::vector<int64_t>& counts, absl::Status* error) {
  const int64_t local = static_cast<int64_t>(w.fc1.size());
  if (ep.size() == 1) {
    std::vector<at::Tensor> outs;
    int64_t begin = 0;
    for (int64_t e = 0; e < local; ++e) {
      outs.push_back(Expert(rows.narrow(0, begin, counts[e]), w.fc1[e], w.fc2[e]));
      begin += counts[e];
    }
    return at::cat(outs, 0);
  }
  const int size = ep.size();
  // How many rows each source sends to each of this rank's experts: [source][local expert].
  const at::Tensor sent_counts =
      at::from_blob(const_cast<int64_t*>(counts.data()), {static_cast<int64_t>(counts.size())},
                    at::kLong)
          .to(rows.device(), /*non_blocking=*/false, /*copy=*/true);
  const std::vector<int64_t> received = ToVector(
      ExchangeRows(ep.comm, sent_counts, std::vector<int64_t>(size, local),
                   std::vector<int64_t>(size, local), "dispatch counts all-to-all", error));
  std::vector<int64_t> send(size, 0), recv(size, 0);
  for (int r = 0; r < size; ++r) {
    for (int64_t j = 0; j < local; ++j) {
      send[r] += counts[r * local + j];
      recv[r] += received[r * local + j];
    }
  }
  const at::Tensor arrived = AllToAllFunction::apply(rows, ep.comm, send, recv, error,
                                                     std::string("dispatch all-to-all"));
  // Arrived rows are [source][local expert]; each expert takes its rows of every source.
  std::vector<int64_t> block_rows(received.begin(), received.end());
  const std::vector<at::Tensor> blocks = arrived.split_with_sizes(block_rows, 0);
  std::vector<at::Tensor> out_blocks(blocks.size());
  for (int64_t j = 0; j < local; ++j) {
    std::vector<at::Tensor> parts;
    std::vector<int64_t> part_rows;
    for (int r = 0; r < size; ++r) {
      parts.push_back(blocks[r * local + j]);
      part_rows.push_back(received[r * local + j]);
    }
    const at::Tensor y = Expert(at::cat(parts, 0), w.fc1[j], w.fc2[j]);
    const std::vector<at::Tensor> back = y.split_with_sizes(part_rows, 0);
    for (int r = 0; r < size; ++r) out_blocks[r * local + j] = back[r];
  }
  return AllToAllFunction::apply(at::cat(out_blocks, 0), ep.comm, recv, send, error,
                                 std::string("combine all-to-all"));
}

}  // namespace

at::Tensor MoeMlp(const GptConfig& config, const MoeWeights& w, const ExpertParallel& ep,
                  const at::Tensor& m, MoeAux* aux, absl::Status* error) {
  const int64_t C = config.hidden, E = config.num_experts, k = config.moe_top_k;
  const at::Tensor x = m.reshape({-1, C});  // [N, C]
  const int64_t N = x.size(0);
  // The router in fp32 (bf16 logits would round the routing decisions and the softmax).
  const at::Tensor logits = at::linear(x.to(at::kFloat), w.router.to(at::kFloat));  // [N, E]
  const at::Tensor probs = at::softmax(logits, -1);
  auto [top_p, top_e] = probs.topk(k, -1);  // [N, k] each, largest first
  const at::Tensor weights = top_p / top_p.sum(-1, /*keepdim=*/true);
  // Token copies sorted by expert (stable), and how many each expert gets.
  const at::Tensor flat_e = top_e.reshape({-1});                         // [N k]
  const at::Tensor order = at::argsort(flat_e, /*stable=*/true, 0, false);  // copies by expert
  const at::Tensor token_of = order.div(k, "floor");
  const at::Tensor counts = at::bincount(flat_e, {}, E);
  const at::Tensor rows = x.index_select(0, token_of);  // [N k, C]
  const at::Tensor y = RunExperts(w, ep, rows, ToVector(counts), error);
  const at::Tensor y_weighted = y * weights.reshape({-1}).index_select(0, order).to(y.scalar_type())
                                        .unsqueeze(1);
  at::Tensor out = at::zeros({N, C}, x.options()).index_add(0, token_of, y_weighted);
  if (w.shared_fc1.defined()) {
    out = out + at::sigmoid(at::linear(x, w.shared_gate)) * Expert(x, w.shared_fc1, w.shared_fc2);
  }
  if (aux != nullptr) {
    const at::Tensor fraction = counts.to(at::kFloat) / static_cast<double>(N * k);
    aux->load_balance = (fraction * probs.mean(0)).sum() * static_cast<double>(E);
    aux->z_loss = at::logsumexp(logits, {-1}).pow(2).mean();
    aux->tokens_per_expert = counts;
    aux->top_experts = top_e;
  }
  return out.view(m.sizes());
}

}  // namespace orthoshard::model
