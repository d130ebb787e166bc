// LayerWiseDistributedOptimizer, DistributedOptimizer, the bucket collectives and model-space state
// assembly (see distributed_optimizer.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "layout/layout.h"
#include "optimizers/distributed/distributed_optimizer.h"

namespace orthoshard::optimizers::distributed {
namespace {

using buffers::ParamAndGradBuffer;

absl::Status CheckDp(const ParamAndGradBuffer& buffer, int dp) {
  if (buffer.layout().dp != dp) {
    return absl::InvalidArgumentError(absl::StrCat("buffer ", buffer.layout().key.ToString(),
                                                   " is sharded over dp ", buffer.layout().dp,
                                                   ", the communicator has ", dp, " ranks"));
  }
  return absl::OkStatus();
}

const layout::ParamPlacement& Placement(const BufferParamRef& ref) {
  return ref.buffer->layout().params[ref.index];
}

std::vector<int64_t> FullShape(const BufferParamRef& ref) {
  return ref.buffer->Param(ref.index).sizes().vec();
}

absl::Status CheckRef(const BufferParamRef& ref, int dp, std::set<std::string>& seen) {
  if (ref.buffer == nullptr || ref.index < 0 ||
      ref.index >= static_cast<int>(ref.buffer->layout().params.size())) {
    return absl::InvalidArgumentError(absl::StrCat("param reference out of range: index ",
                                                   ref.index));
  }
  RETURN_IF_ERROR(CheckDp(*ref.buffer, dp));
  const std::string& name = Placement(ref).name;
  if (!seen.insert(name).second) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate param name '", name, "'"));
  }
  return absl::OkStatus();
}

ShardedTensor Piece(std::string name, std::vector<int64_t> full_shape, int64_t offset,
                    const at::Tensor& t) {
  return {std::move(name), std::move(full_shape), offset, t.reshape({-1}).clone()};
}

ShardedTensor Counter(std::string name, int64_t value) {
  return {std::move(name), {}, 0, at::full({}, value, at::kLong)};
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

// ---- model-space state ----

namespace {

// The elements [offset, offset + numel) of the whole tensor `name` (fp32 or int64, 1-D), from
// `pieces`.
absl::StatusOr<at::Tensor> GatherRange(absl::Span<const ShardedTensor> pieces,
                                       const std::string& name,
                                       const std::vector<int64_t>& full_shape, int64_t offset,
                                       int64_t numel, at::ScalarType dtype) {
  at::Tensor out = at::empty({numel}, dtype);
  std::vector<std::pair<int64_t, int64_t>> covered;
  bool found = false;
  for (const ShardedTensor& p : pieces) {
    if (p.name != name) continue;
    found = true;
    if (p.full_shape != full_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("state tensor '", name, "': expected shape ", ShapeString(full_shape),
                       ", received ", ShapeString(p.full_shape)));
    }
    if (p.tensor.scalar_type() != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("state tensor '", name, "': expected dtype ", c10::toString(dtype),
                       ", received ", c10::toString(p.tensor.scalar_type())));
    }
    const int64_t n = p.tensor.numel();
    if (p.offset < 0 || p.offset + n > Numel(full_shape)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state tensor '", name, "': piece [", p.offset, ", ", p.offset + n,
                       ") outside ", Numel(full_shape), " elements"));
    }
    const int64_t lo = std::max(offset, p.offset);
    const int64_t hi = std::min(offset + numel, p.offset + n);
    if (lo >= hi) continue;
    out.narrow(0, lo - offset, hi - lo)
        .copy_(p.tensor.reshape({-1}).narrow(0, lo - p.offset, hi - lo));
    covered.push_back({lo, hi});
  }
  if (!found) return absl::NotFoundError(absl::StrCat("missing state tensor '", name, "'"));
  std::sort(covered.begin(), covered.end());
  int64_t reach = offset;
  int64_t have = 0;
  for (const auto& [lo, hi] : covered) {
    if (hi <= reach) continue;
    have += hi - std::max(lo, reach);
    reach = std::max(reach, hi);
  }
  if (have != numel) {
    return absl::NotFoundError(absl::StrCat("state tensor '", name, "' covers ", have, " of ",
                                            numel, " elements needed at offset ", offset));
  }
  return out;
}

absl::StatusOr<int64_t> GatherCounter(absl::Span<const ShardedTensor> pieces,
                                      const std::string& name) {
  for (const ShardedTensor& p : pieces) {
    if (p.name != name) continue;
    if (p.tensor.numel() != 1 || p.tensor.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError(
          absl::StrCat("state tensor '", name, "': expected an int64 scalar, received ",
                       c10::toString(p.tensor.scalar_type()), " ", ShapeString(p.tensor.sizes())));
    }
    return p.tensor.item<int64_t>();
  }
  return absl::NotFoundError(absl::StrCat("missing state tensor '", name, "'"));
}

}  // namespace

absl::StatusOr<std::vector<NamedTensor>> AssembleModelSpace(
    absl::Span<const ShardedTensor> pieces) {
  std::map<std::string, const ShardedTensor*> first;
  for (const ShardedTensor& p : pieces) first.emplace(p.name, &p);
  std::vector<NamedTensor> out;
  for (const auto& [name, p] : first) {
    at::Tensor whole;
    if (p->full_shape.empty() && p->tensor.scalar_type() == at::kLong) {
      ASSIGN_OR_RETURN(int64_t v, GatherCounter(pieces, name));
      whole = at::full({}, v, at::kLong);
    } else {
      ASSIGN_OR_RETURN(whole, GatherRange(pieces, name, p->full_shape, 0, Numel(p->full_shape),
                                          p->tensor.scalar_type()));
      whole = whole.view(p->full_shape);
    }
    out.push_back({name, whole});
  }
  return out;
}

// ---- LayerWiseDistributedOptimizer ----

absl::StatusOr<std::unique_ptr<LayerWiseDistributedOptimizer>>
LayerWiseDistributedOptimizer::Create(std::vector<LayerWiseParam> params, int rank, int dp) {
  std::set<std::string> seen;
  std::vector<Slot> slots;
  for (LayerWiseParam& lp : params) {
    RETURN_IF_ERROR(CheckRef(lp.ref, dp, seen));
    RETURN_IF_ERROR(ValidateMuonHyper(lp.hp));
    const layout::PerBufferParamLayout& layout = lp.ref.buffer->layout();
    const layout::ParamPlacement& placement = Placement(lp.ref);
    const int owner = layout.OwnerOf(placement);
    if (owner < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", placement.name, "' straddles a shard boundary of a ",
          layout::StrategyName(layout.strategy),
          " buffer; the layer-wise optimizer needs a shard-aligned layout"));
    }
    const std::vector<int64_t> shape = FullShape(lp.ref);
    if (shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", placement.name, "': Muon needs a 2-D matrix, got shape ", ShapeString(shape)));
    }
    RETURN_IF_ERROR(ValidateSplit(placement.name, lp.split, shape[0]));
    if (owner != rank) continue;
    Param p{placement.name, lp.ref.buffer->ParamView(lp.ref.index),
            lp.ref.buffer->GradView(lp.ref.index), lp.split};
    ASSIGN_OR_RETURN(MainParam main, MakeMainParam(std::move(p)));
    at::Tensor momentum = at::zeros_like(main.main);
    slots.push_back({std::move(main), lp.hp, momentum});
  }
  return std::unique_ptr<LayerWiseDistributedOptimizer>(
      new LayerWiseDistributedOptimizer(std::move(slots)));
}

absl::StatusOr<double> LayerWiseDistributedOptimizer::LocalGradSumSquares() const {
  std::vector<MainParam> params;
  for (const Slot& s : slots_) params.push_back(s.p);
  return optimizers::LocalGradSumSquares(params);
}

absl::Status LayerWiseDistributedOptimizer::Step(const StepContext& context) {
  try {
    for (Slot& s : slots_) {
      MuonUpdate(s.p.main, GradAsFloat(s.p.param.grad, context.grad_scale), s.momentum_buffer,
                 s.hp, s.hp.lr * context.lr_multiplier, s.p.param.split);
      SyncModelParam(s.p);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("layer-wise Muon step: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

std::vector<ShardedTensor> LayerWiseDistributedOptimizer::ExportState() const {
  std::vector<ShardedTensor> out;
  for (const Slot& s : slots_) {
    const std::vector<int64_t> shape = s.p.main.sizes().vec();
    out.push_back(Piece(absl::StrCat(s.p.param.name, "/momentum_buffer"), shape, 0,
                        s.momentum_buffer));
    if (s.p.owns_main()) {
      out.push_back(Piece(absl::StrCat(s.p.param.name, "/main_param"), shape, 0, s.p.main));
    }
  }
  return out;
}

absl::Status LayerWiseDistributedOptimizer::ImportState(absl::Span<const ShardedTensor> state,
                                                        bool validate_only) {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, source)
  for (const Slot& s : slots_) {
    const std::vector<int64_t> shape = s.p.main.sizes().vec();
    ASSIGN_OR_RETURN(at::Tensor m,
                     GatherRange(state, absl::StrCat(s.p.param.name, "/momentum_buffer"), shape, 0,
                                 s.p.main.numel(), at::kFloat));
    copies.push_back({s.momentum_buffer, m.view(shape)});
    if (s.p.owns_main()) {
      ASSIGN_OR_RETURN(at::Tensor main,
                       GatherRange(state, absl::StrCat(s.p.param.name, "/main_param"), shape, 0,
                                   s.p.main.numel(), at::kFloat));
      copies.push_back({s.p.main, main.view(shape)});
    }
  }
  if (validate_only) return absl::OkStatus();
  for (auto& [dst, src] : copies) dst.copy_(src);
  return absl::OkStatus();
}

std::vector<std::string> LayerWiseDistributedOptimizer::OwnedParams() const {
  std::vector<std::string> names;
  for (const Slot& s : slots_) names.push_back(s.p.param.name);
  return names;
}

// ---- DistributedOptimizer ----

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    std::vector<DistOptParam> params, int rank, int dp) {
  std::set<std::string> seen;
  std::vector<Slot> slots;
  for (DistOptParam& dpar : params) {
    RETURN_IF_ERROR(CheckRef(dpar.ref, dp, seen));
    RETURN_IF_ERROR(ValidateAdamWHyper(dpar.hp));
    const ParamAndGradBuffer& buffer = *dpar.ref.buffer;
    const layout::ParamPlacement& placement = Placement(dpar.ref);
    const auto [shard_begin, shard_end] = buffer.layout().ShardRange(placement.bucket, rank);
    const int64_t lo = std::max(placement.start, shard_begin);
    const int64_t hi = std::min(placement.end, shard_end);
    if (lo >= hi) continue;
    Param p{placement.name, buffer.param_data().narrow(0, lo, hi - lo),
            buffer.grad_data().narrow(0, lo, hi - lo), {}};
    ASSIGN_OR_RETURN(MainParam main, MakeMainParam(std::move(p)));
    AdamWState state = MakeAdamWState(main.main);
    slots.push_back({std::move(main), FullShape(dpar.ref), lo - placement.start, dpar.hp,
                     std::move(state)});
  }
  return std::unique_ptr<DistributedOptimizer>(new DistributedOptimizer(std::move(slots)));
}

absl::StatusOr<double> DistributedOptimizer::LocalGradSumSquares() const {
  std::vector<MainParam> params;
  for (const Slot& s : slots_) params.push_back(s.p);
  return optimizers::LocalGradSumSquares(params);
}

absl::Status DistributedOptimizer::Step(const StepContext& context) {
  try {
    for (Slot& s : slots_) {
      AdamWUpdate(s.p.main, GradAsFloat(s.p.param.grad, context.grad_scale), s.state, s.hp,
                  s.hp.lr * context.lr_multiplier);
      SyncModelParam(s.p);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("ZeRO-1 AdamW step: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

std::vector<ShardedTensor> DistributedOptimizer::ExportState() const {
  std::vector<ShardedTensor> out;
  for (const Slot& s : slots_) {
    const std::string& name = s.p.param.name;
    out.push_back(Piece(absl::StrCat(name, "/exp_avg"), s.full_shape, s.offset, s.state.exp_avg));
    out.push_back(
        Piece(absl::StrCat(name, "/exp_avg_sq"), s.full_shape, s.offset, s.state.exp_avg_sq));
    out.push_back(Counter(absl::StrCat(name, "/step"), s.state.step));
    if (s.p.owns_main()) {
      out.push_back(Piece(absl::StrCat(name, "/main_param"), s.full_shape, s.offset, s.p.main));
    }
  }
  return out;
}

absl::Status DistributedOptimizer::ImportState(absl::Span<const ShardedTensor> state,
                                               bool validate_only) {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::vector<int64_t> steps;
  for (const Slot& s : slots_) {
    const std::string& name = s.p.param.name;
    const int64_t n = s.p.main.numel();
    ASSIGN_OR_RETURN(at::Tensor m, GatherRange(state, absl::StrCat(name, "/exp_avg"), s.full_shape,
                                               s.offset, n, at::kFloat));
    ASSIGN_OR_RETURN(at::Tensor v, GatherRange(state, absl::StrCat(name, "/exp_avg_sq"),
                                               s.full_shape, s.offset, n, at::kFloat));
    ASSIGN_OR_RETURN(int64_t step, GatherCounter(state, absl::StrCat(name, "/step")));
    copies.push_back({s.state.exp_avg, m});
    copies.push_back({s.state.exp_avg_sq, v});
    steps.push_back(step);
    if (s.p.owns_main()) {
      ASSIGN_OR_RETURN(at::Tensor main, GatherRange(state, absl::StrCat(name, "/main_param"),
                                                    s.full_shape, s.offset, n, at::kFloat));
      copies.push_back({s.p.main, main});
    }
  }
  if (validate_only) return absl::OkStatus();
  for (auto& [dst, src] : copies) dst.copy_(src);
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].state.step = steps[i];
  return absl::OkStatus();
}

int64_t DistributedOptimizer::owned_numel() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.p.main.numel();
  return n;
}

}  // namespace orthoshard::optimizers::distributed
