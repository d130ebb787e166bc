#include "optimizers/distributed/tp_newton_schulz.h"

#include <utility>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "layout/tp_homes.h"

namespace orthoshard::optimizers::distributed {

absl::StatusOr<std::unique_ptr<CollectiveTpNewtonSchulz>> CollectiveTpNewtonSchulz::Create(
    collectives::Communicator* tp, MuonTpMode mode) {
  if (tp == nullptr) return absl::InvalidArgumentError("tp Newton-Schulz: tp communicator is null");
  if (mode == MuonTpMode::kBlockwise) {
    return absl::InvalidArgumentError(
        "tp Newton-Schulz: blockwise mode orthogonalises each slice locally and needs no exchange");
  }
  return std::unique_ptr<CollectiveTpNewtonSchulz>(new CollectiveTpNewtonSchulz(tp, mode));
}

absl::Status CollectiveTpNewtonSchulz::Prepare(std::vector<TpNsMatrix> matrices) {
  costs_.clear();
  for (const TpNsMatrix& m : matrices) {
    if (m.global_shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("tp Newton-Schulz: param '", m.name, "' is not a 2-D matrix"));
    }
    if (m.tp.size != tp_->size() || m.tp.rank != tp_->rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp Newton-Schulz: param '", m.name, "' is split as ", m.tp.ToString(),
          ", but this rank is tp rank ", tp_->rank(), " of ", tp_->size()));
    }
    costs_.push_back(NsCost(m.global_shape[0], m.global_shape[1], m.split));
  }
  matrices_ = std::move(matrices);
  homes_ = mode_ == MuonTpMode::kOwner ? layout::AssignTpHomes(costs_, tp_->size())
                                       : std::vector<int>(matrices_.size(), -1);
  return absl::OkStatus();
}

double CollectiveTpNewtonSchulz::ns_cost() const {
  double cost = 0.0;
  for (size_t m = 0; m < matrices_.size(); ++m) {
    if (homes_[m] < 0 || homes_[m] == tp_->rank()) cost += costs_[m];
  }
  return cost;
}

absl::StatusOr<std::vector<at::Tensor>> CollectiveTpNewtonSchulz::Orthogonalize(
    absl::Span<const std::pair<int, at::Tensor>> inputs) {
  for (const auto& [index, slice] : inputs) {
    if (index < 0 || index >= static_cast<int>(matrices_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("tp Newton-Schulz: matrix index ", index,
                                                     " out of range [0, ", matrices_.size(), ")"));
    }
  }
  if (inputs.empty()) return std::vector<at::Tensor>{};
  return mode_ == MuonTpMode::kOwner ? Owner(inputs) : Duplicated(inputs);
}

namespace {

// Every rank's slice of matrix `m`, read from `flat` where rank q's slice starts at starts[q].
std::vector<at::Tensor> SlicesAt(const at::Tensor& flat, const std::vector<int64_t>& starts,
                                 const at::Tensor& local) {
  std::vector<at::Tensor> slices;
  for (const int64_t start : starts) {
    slices.push_back(flat.narrow(0, start, local.numel()).view(local.sizes()));
  }
  return slices;
}

}  // namespace

absl::StatusOr<std::vector<at::Tensor>> CollectiveTpNewtonSchulz::Owner(
    absl::Span<const std::pair<int, at::Tensor>> inputs) {
  const int size = tp_->size();
  const int me = tp_->rank();
  const at::TensorOptions options = inputs.front().second.options();
  // The send layout: to each home in rank order, its matrices' slices in call order. `offset[k]` is
  // input k's offset in it; the reply comes back in the same layout.
  std::vector<int64_t> to_home(size, 0);
  for (const auto& [index, slice] : inputs) to_home[homes_[index]] += slice.numel();
  std::vector<int64_t> home_start(size, 0);
  for (int h = 1; h < size; ++h) home_start[h] = home_start[h - 1] + to_home[h - 1];
  std::vector<int64_t> offset(inputs.size());
  std::vector<int64_t> cursor = home_start;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const int h = homes_[inputs[k].first];
    offset[k] = cursor[h];
    cursor[h] += inputs[k].second.numel();
  }
  const int64_t total = home_start[size - 1] + to_home[size - 1];
  at::Tensor send = at::empty({total}, options);
  for (size_t k = 0; k < inputs.size(); ++k) {
    send.narrow(0, offset[k], inputs[k].second.numel()).copy_(inputs[k].second.reshape({-1}));
  }
  // What this rank is home to: from every rank, the same matrices' slices (equal local shapes).
  std::vector<size_t> mine;
  std::vector<int64_t> mine_at;  // offset within one rank's part
  int64_t mine_total = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (homes_[inputs[k].first] != me) continue;
    mine.push_back(k);
    mine_at.push_back(mine_total);
    mine_total += inputs[k].second.numel();
  }
  at::Tensor received = at::empty({size * mine_total}, options);
  collectives::AllToAllOptions there;
  there.input_split_sizes = to_home;
  there.output_split_sizes.assign(size, mine_total);
  {
    ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, tp_->AllToAll(send, received, there));
    RETURN_IF_ERROR(work->Wait(tp_->timeout()));
  }
  // The home's Newton–Schulz, every matrix it holds at once (batched as Muon batches).
  std::vector<at::Tensor> globals;
  std::vector<NsJob> jobs;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& [index, local] = inputs[mine[i]];
    const TpNsMatrix& m = matrices_[index];
    std::vector<int64_t> starts;
    for (int q = 0; q < size; ++q) starts.push_back(q * mine_total + mine_at[i]);
    globals.push_back(AssembleTpMatrix(SlicesAt(received, starts, local), m.tp, m.global_shape));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const TpNsMatrix& m = matrices_[inputs[mine[i]].first];
    jobs.push_back({globals[i], &m.split, &m.ns});
  }
  const std::vector<at::Tensor> orthos = OrthogonalizeWhole(jobs);
  // Back: each rank its slices, in the layout it sent them.
  at::Tensor reply = at::empty({size * mine_total}, options);
  for (size_t i = 0; i < mine.size(); ++i) {
    const TpNsMatrix& m = matrices_[inputs[mine[i]].first];
    const int64_t n = inputs[mine[i]].second.numel();
    for (int q = 0; q < size; ++q) {
      reply.narrow(0, q * mine_total + mine_at[i], n)
          .copy_(TpSliceOf(orthos[i], m.tp.ForRank(q)).reshape({-1}));
    }
  }
  at::Tensor back = at::empty({total}, options);
  collectives::AllToAllOptions home;
  home.input_split_sizes.assign(size, mine_total);
  home.output_split_sizes = to_home;
  {
    ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, tp_->AllToAll(reply, back, home));
    RETURN_IF_ERROR(work->Wait(tp_->timeout()));
  }
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const at::Tensor& local = inputs[k].second;
    out.push_back(back.narrow(0, offset[k], local.numel()).view(local.sizes()));
  }
  return out;
}

absl::StatusOr<std::vector<at::Tensor>> CollectiveTpNewtonSchulz::Duplicated(
    absl::Span<const std::pair<int, at::Tensor>> inputs) {
  const int size = tp_->size();
  std::vector<at::Tensor> flat;
  std::vector<int64_t> offset;
  int64_t total = 0;
  for (const auto& [index, slice] : inputs) {
    flat.push_back(slice.reshape({-1}));
    offset.push_back(total);
    total += slice.numel();
  }
  at::Tensor send = at::cat(flat);
  at::Tensor gathered = at::empty({size * total}, send.options());
  {
    ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, tp_->AllGather(send, gathered));
    RETURN_IF_ERROR(work->Wait(tp_->timeout()));
  }
  std::vector<at::Tensor> globals;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TpNsMatrix& m = matrices_[inputs[k].first];
    std::vector<int64_t> starts;
    for (int q = 0; q < size; ++q) starts.push_back(q * total + offset[k]);
    globals.push_back(AssembleTpMatrix(SlicesAt(gathered, starts, inputs[k].second), m.tp,
                                       m.global_shape));
  }
  std::vector<NsJob> jobs;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TpNsMatrix& m = matrices_[inputs[k].first];
    jobs.push_back({globals[k], &m.split, &m.ns});
  }
  const std::vector<at::Tensor> orthos = OrthogonalizeWhole(jobs);
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    out.push_back(TpSliceOf(orthos[k], matrices_[inputs[k].first].tp));
  }
  return out;
}

}  // namespace orthoshard::optimizers::distributed
