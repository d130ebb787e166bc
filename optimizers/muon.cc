#include "optimizers/muon.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "optimizers/internal/fused_elementwise.h"
#include "optimizers/tp_muon.h"

namespace orthoshard::optimizers {

absl::Status ValidateMuonHyper(const MuonHyper& hp) {
  if (!(hp.lr >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("Muon: lr must be >= 0, got ", hp.lr));
  }
  if (!(hp.weight_decay >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon: weight_decay must be >= 0, got ", hp.weight_decay));
  }
  if (!(hp.momentum >= 0.0 && hp.momentum < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon: momentum must be in [0, 1), got ", hp.momentum));
  }
  if (hp.ns.ns_steps < 1 || hp.ns.ns_steps >= 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon: ns_steps must be in [1, 100), got ", hp.ns.ns_steps));
  }
  if (!(hp.ns.eps > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("Muon: eps must be > 0, got ", hp.ns.eps));
  }
  if (hp.ns.coefficients.empty()) {
    return absl::InvalidArgumentError("Muon: Newton-Schulz coefficients must not be empty");
  }
  for (const NsCoefficients& triple : hp.ns.coefficients) {
    for (double c : triple) {
      if (!(std::abs(c) <= kMaxNsCoefficient)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Muon: Newton-Schulz coefficients must be in [-", kMaxNsCoefficient, ", ",
                         kMaxNsCoefficient, "], got ", c));
      }
    }
  }
  if (!(hp.ns.norm_scale > 0.0 && std::isfinite(hp.ns.norm_scale))) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon: norm_scale must be > 0 and finite, got ", hp.ns.norm_scale));
  }
  if (absl::Status bounded = CheckNsScheduleBounded(hp.ns.coefficients, hp.ns.norm_scale,
                                                    hp.ns.ns_steps, hp.ns.cycle);
      !bounded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Muon: ", bounded.message()));
  }
  if (hp.ns.gram && hp.ns.dtype != NsDType::kFloat32) {
    return absl::InvalidArgumentError(
        "Muon: the Gram form of Newton-Schulz carries its Gram matrix from step to step instead of "
        "recomputing it, so low-precision rounding is never corrected: it needs the fp32 "
        "iteration (ns dtype fp32)");
  }
  if (hp.scale_rule == MuonScaleRule::kSpectral && !(hp.extra_scale > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon: extra_scale must be > 0 for the spectral rule, got ", hp.extra_scale));
  }
  return absl::OkStatus();
}

absl::Status SetNsSchedule(absl::string_view schedule, NewtonSchulzOptions* ns) {
  ASSIGN_OR_RETURN(NsSchedule parsed, ParseNsSchedule(schedule));
  ns->coefficients = std::move(parsed.coefficients);
  ns->norm_scale = parsed.norm_scale;
  ns->cycle = parsed.cycle;
  return absl::OkStatus();
}

namespace {

// The norm X is divided by (see NewtonSchulzOptions::norm_scale); `norm` is ||X||_F.
at::Tensor NsDivisor(const at::Tensor& norm, const NewtonSchulzOptions& options) {
  // The multiply only when asked: with norm_scale 1 the ops are torch.optim.Muon's.
  return (options.norm_scale == 1.0 ? norm : norm.mul(options.norm_scale)).clamp(options.eps);
}

// The coefficients of iteration i.
const NsCoefficients& NsCoefficientsAt(const NewtonSchulzOptions& options, int i) {
  return options.coefficients[NsCoefficientIndex(options.coefficients.size(), i, options.cycle)];
}

at::ScalarType NsScalarType(const NewtonSchulzOptions& options) {
  return options.dtype == NsDType::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

// Matrix products of 2-D matrices or 3-D stacks.
at::Tensor MatMul(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 3 ? at::bmm(a, b) : at::mm(a, b);
}
at::Tensor AddMatMul(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, double beta,
                     double alpha) {
  return a.dim() == 3 ? at::baddbmm(self, a, b, beta, alpha) : at::addmm(self, a, b, beta, alpha);
}
at::Tensor Transposed(const at::Tensor& x) { return x.transpose(-2, -1); }

// NewtonSchulz on `x`, already in the NS dtype and owned by the caller (normalised in place).
at::Tensor NewtonSchulzInPlace(at::Tensor x, const NewtonSchulzOptions& options) {
  // Op for op torch/optim/_muon.py `_zeropower_via_newtonschulz` (with one triple, norm_scale 1).
  const bool transpose = x.size(0) > x.size(1);
  if (transpose) x = x.t();
  x.div_(NsDivisor(at::linalg_vector_norm(x, 2), options));
  if (options.gram && GramNewtonSchulzSavesWork(x.size(0), x.size(1), options.ns_steps)) {
    x = NsIterateGram(x, options);
    return transpose ? x.t() : x;
  }
  // The _out forms run the same kernels as at::mm / at::addmm (so the same bits) into buffers
  // allocated once: A and bA + cA^2 reuse theirs, X ping-pongs between two row-major [m, n]
  // buffers, as at::addmm's fresh outputs are. The input is one of them only when its strides are
  // exactly row-major: ATen picks the gemm from the output's strides, and the transpose of an
  // [n, 1] column counts as contiguous with strides (1, 1), which gave other bits in fp32.
  const int64_t m = x.size(0);
  at::Tensor gram = at::empty({m, m}, x.options());
  at::Tensor gram_update = at::empty({m, m}, x.options());
  at::Tensor spare = at::empty(x.sizes(), x.options());
  const bool row_major = x.stride(1) == 1 && x.stride(0) == x.size(1);
  at::Tensor other = row_major ? x : at::empty(x.sizes(), x.options());
  for (int i = 0; i < options.ns_steps; ++i) {
    const auto [a, b, c] = NsCoefficientsAt(options, i);
    at::mm_out(gram, x, x.t());                          // A = X X^T, m = min(rows, cols)
    at::addmm_out(gram_update, gram, gram, gram, b, c);  // b A + c A^2
    at::addmm_out(spare, x, gram_update, x, a);          // a X + (b A + c A^2) X
    x = spare;
    std::swap(spare, other);
  }
  return transpose ? x.t() : x;
}

}  // namespace

bool GramNewtonSchulzSavesWork(int64_t rows, int64_t cols, int steps) {
  // 4 m^2 n + 2 m^3 (4s - 3) < s (4 m^2 n + 2 m^3)  <=>  n > 1.5 m (for s >= 2); asking for
  // n >= 2 m keeps a margin (16% fewer FLOPs at 2 m, 5 steps) for the [m, m] GEMMs' other speed.
  return steps >= 2 && std::max(rows, cols) >= 2 * std::min(rows, cols);
}

at::Tensor NsIterateDirect(at::Tensor x, const NewtonSchulzOptions& options) {
  for (int i = 0; i < options.ns_steps; ++i) {
    const auto [a, b, c] = NsCoefficientsAt(options, i);
    const at::Tensor gram = MatMul(x, Transposed(x));             // A = X X^T
    const at::Tensor gram_update = AddMatMul(gram, gram, gram, b, c);  // b A + c A^2
    x = AddMatMul(x, gram_update, x, a, 1.0);                     // a X + (b A + c A^2) X
  }
  return x;
}

at::Tensor NsIterateGram(at::Tensor x, const NewtonSchulzOptions& options) {
  at::Tensor gram = MatMul(x, Transposed(x));  // A_0
  at::Tensor q;                                // Q (undefined: the identity)
  for (int i = 0; i < options.ns_steps; ++i) {
    if (i > 0 && i % kGramRestart == 0) {  // restart from the iterate X = Q X_0
      x = MatMul(q, x);
      q = at::Tensor();
      gram = MatMul(x, Transposed(x));
    }
    const auto [a, b, c] = NsCoefficientsAt(options, i);
    at::Tensor poly = AddMatMul(gram, gram, gram, b, c);  // b A + c A^2
    poly.diagonal(0, -2, -1).add_(a);                     // p(A) = a I + b A + c A^2
    q = q.defined() ? MatMul(poly, q) : poly;
    // A_{k+1} = p(A) (p(A) A), unless no step reads it (the last, or a restart next).
    if (i + 1 < options.ns_steps && (i + 1) % kGramRestart != 0) {
      gram = MatMul(poly, MatMul(poly, gram));
    }
  }
  return MatMul(q, x);
}

at::Tensor NewtonSchulz(const at::Tensor& g, const NewtonSchulzOptions& options) {
  // The copy is explicit so that an fp32 iteration on an fp32 input never writes through to the
  // caller's tensor.
  return NewtonSchulzInPlace(g.to(NsScalarType(options), /*non_blocking=*/false, /*copy=*/true),
                             options);
}

double MuonLrScale(int64_t rows, int64_t cols, const MuonHyper& hp) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  switch (hp.scale_rule) {
    case MuonScaleRule::kOriginal:
      return std::sqrt(std::max(1.0, r / c));
    case MuonScaleRule::kMatchRmsAdamW:
      return 0.2 * std::sqrt(std::max(r, c));
    case MuonScaleRule::kSpectral:
      return hp.extra_scale * std::sqrt(std::max(r, c));
  }
  return 1.0;
}

namespace {

// Momentum and Nesterov: the matrix Newton–Schulz orthogonalises. *owned: a fresh tensor in the NS
// dtype (else the momentum buffer or a fresh fp32 tensor, which NewtonSchulz copies).
at::Tensor MuonDirection(const at::Tensor& grad, const at::Tensor& momentum_buffer,
                         const MuonHyper& hp, bool* owned) {
  // The momentum, Nesterov and cast-to-NS-dtype steps run as one fused pass on dense CPU tensors
  // (bitwise equal to the ATen ops in the else branch; see internal/fused_elementwise.h).
  if (internal::CanFuseMomentum(momentum_buffer, grad, hp.momentum)) {
    *owned = true;
    return internal::FusedMomentum(momentum_buffer, grad, hp.momentum, hp.nesterov,
                                   NsScalarType(hp.ns));
  }
  *owned = false;
  momentum_buffer.lerp_(grad, 1.0 - hp.momentum);
  return hp.nesterov ? at::lerp(grad, momentum_buffer, hp.momentum) : momentum_buffer;
}

// The matrices Newton–Schulz orthogonalises: the whole `update`, or block j of every group of a
// fused weight ([G * r_j, cols]).
std::vector<at::Tensor> NsBlocks(const at::Tensor& update, const FusedSplit& split) {
  if (split.block_rows.empty()) return {update};
  const int64_t groups = split.num_groups;
  const int64_t cols = update.size(1);
  const at::Tensor update3 = update.view({groups, update.size(0) / groups, cols});
  std::vector<at::Tensor> blocks;
  int64_t offset = 0;
  for (int64_t r : split.block_rows) {
    blocks.push_back(update3.narrow(1, offset, r).reshape({groups * r, cols}));
    offset += r;
  }
  return blocks;
}

// Decoupled weight decay, then each orthogonalised block added with its scaled lr.
void ApplyOrthos(const at::Tensor& param, const std::vector<at::Tensor>& orthos,
                 const MuonHyper& hp, double lr, const FusedSplit& split) {
  const int64_t cols = param.size(1);
  const double decay = 1.0 - lr * hp.weight_decay;
  if (split.block_rows.empty()) {
    const double adjusted_lr = lr * MuonLrScale(param.size(0), cols, hp);
    if (internal::CanFuseDecayAdd(param, orthos[0])) {
      internal::FusedDecayAdd(param, decay, orthos[0], -adjusted_lr);
    } else {
      param.mul_(decay);
      param.add_(orthos[0], -adjusted_lr);
    }
    return;
  }
  const int64_t groups = split.num_groups;
  param.mul_(decay);
  const at::Tensor param3 = param.view({groups, param.size(0) / groups, cols});
  int64_t offset = 0;
  for (size_t j = 0; j < orthos.size(); ++j) {
    const int64_t r = split.block_rows[j];
    const double adjusted_lr = lr * MuonLrScale(groups * r, cols, hp);
    param3.narrow(1, offset, r).add_(orthos[j].reshape({groups, r, cols}), -adjusted_lr);
    offset += r;
  }
}

}  // namespace

at::Tensor NewtonSchulzBatched(const at::Tensor& g, const NewtonSchulzOptions& options) {
  // NewtonSchulzInPlace with a leading batch dimension: per-matrix norms, bmm / baddbmm.
  at::Tensor x = g.to(NsScalarType(options), /*non_blocking=*/false, /*copy=*/true);
  const bool transpose = x.size(1) > x.size(2);
  if (transpose) x = x.transpose(1, 2);
  x.div_(NsDivisor(at::linalg_vector_norm(x, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true), options));
  x = options.gram && GramNewtonSchulzSavesWork(x.size(1), x.size(2), options.ns_steps)
          ? NsIterateGram(x, options)
          : NsIterateDirect(x, options);
  return transpose ? x.transpose(1, 2) : x;
}

std::vector<std::vector<at::Tensor>> OrthogonalizeBlocks(absl::Span<const NsJob> jobs) {
  static const FusedSplit kWhole;
  std::vector<std::vector<at::Tensor>> blocks(jobs.size()), orthos(jobs.size());
  for (size_t k = 0; k < jobs.size(); ++k) {
    blocks[k] = NsBlocks(jobs[k].matrix, jobs[k].split == nullptr ? kWhole : *jobs[k].split);
    orthos[k].resize(blocks[k].size());
  }
  using Key = std::tuple<int64_t, int64_t, std::vector<NsCoefficients>, bool, int, double,
                         double, NsDType, bool, bool>;
  std::map<Key, std::vector<std::pair<size_t, size_t>>> same;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const NewtonSchulzOptions& ns = *jobs[k].ns;
    for (size_t j = 0; j < blocks[k].size(); ++j) {
      same[Key{blocks[k][j].size(0), blocks[k][j].size(1), ns.coefficients, ns.cycle, ns.ns_steps,
               ns.eps, ns.norm_scale, ns.dtype, ns.batched, ns.gram}]
          .push_back({k, j});
    }
  }
  for (const auto& [key, members] : same) {
    const NewtonSchulzOptions& ns = *jobs[members.front().first].ns;
    if (members.size() == 1 || !ns.batched) {
      for (const auto& [k, j] : members) orthos[k][j] = NewtonSchulz(blocks[k][j], ns);
      continue;
    }
    std::vector<at::Tensor> stack;
    for (const auto& [k, j] : members) stack.push_back(blocks[k][j]);
    const at::Tensor out = NewtonSchulzBatched(at::stack(stack), ns);
    for (size_t m = 0; m < members.size(); ++m) {
      orthos[members[m].first][members[m].second] = out.select(0, static_cast<int64_t>(m));
    }
  }
  return orthos;
}

void MuonUpdate(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum_buffer,
                const MuonHyper& hp, double lr, const FusedSplit& split) {
  bool owned = false;
  const at::Tensor update = MuonDirection(grad, momentum_buffer, hp, &owned);
  std::vector<at::Tensor> orthos;
  for (const at::Tensor& block : NsBlocks(update, split)) {
    // A fresh whole-matrix update is orthogonalised in place (no copy); anything else is copied.
    orthos.push_back(owned && split.block_rows.empty() ? NewtonSchulzInPlace(block, hp.ns)
                                                       : NewtonSchulz(block, hp.ns));
  }
  ApplyOrthos(param, orthos, hp, lr, split);
}

absl::StatusOr<std::unique_ptr<Muon>> Muon::Create(std::vector<Entry> entries,
                                                   TpNewtonSchulz* tp_ns) {
  std::unique_ptr<Muon> opt(new Muon());
  opt->tp_ns_ = tp_ns;
  std::vector<TpNsMatrix> tp_matrices;
  for (Entry& e : entries) {
    RETURN_IF_ERROR(ValidateMuonHyper(e.hp));
    const Slot& s = e.slot;
    if (s.param.defined() && !s.covers_whole()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", s.name, "': Muon needs the whole matrix, got a part of ",
          s.param.numel(), " elements at offset ", s.offset, " of ", ShapeString(s.full_shape)));
    }
    if (s.param.defined() && s.param.dim() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("param '", s.name,
                                                     "': Muon needs a 2-D matrix, got shape ",
                                                     ShapeString(s.param.sizes())));
    }
    RETURN_IF_ERROR(opt->Add(std::move(e.slot)));
    const Slot& added = opt->slots_.back().slot;
    const std::vector<int64_t> global_shape = TpGlobalShape(added.full_shape, added.tp);
    RETURN_IF_ERROR(ValidateSplit(added.name, e.split, global_shape[0]));
    int tp_index = -1;
    if (added.tp.split() && tp_ns != nullptr) {
      tp_index = static_cast<int>(tp_matrices.size());
      tp_matrices.push_back({added.name, global_shape, added.tp, e.split, e.hp.ns});
    } else if (added.tp.split()) {  // blockwise: the slice's own blocks
      ASSIGN_OR_RETURN(e.split, TpLocalFusedSplit(e.split, added.tp, added.name));
    }
    opt->hps_.push_back(e.hp);
    opt->splits_.push_back(std::move(e.split));
    opt->tp_index_.push_back(tp_index);
    opt->global_shapes_.push_back(global_shape);
    opt->momentum_.push_back(at::zeros_like(opt->slots_.back().main));
  }
  if (tp_ns != nullptr) RETURN_IF_ERROR(tp_ns->Prepare(std::move(tp_matrices)));
  return opt;
}

std::vector<std::string> Muon::FieldNames() const { return {"momentum_buffer", "main_param"}; }

void Muon::Update(size_t i, const at::Tensor& grad, double lr_multiplier) {
  MuonUpdate(slots_[i].main, grad, momentum_[i], hps_[i], hps_[i].lr * lr_multiplier, splits_[i]);
}

absl::Status Muon::UpdateSlots(absl::Span<const int64_t> indices, const StepContext& context) {
  bool batched = false;
  bool tp = false;
  for (const int64_t i : indices) {
    batched = batched || hps_[i].ns.batched;
    tp = tp || tp_index_[i] >= 0;
  }
  if (!batched && !tp) return SlotOptimizer::UpdateSlots(indices, context);
  // 1. Every slot's direction: the local matrices cut into blocks, the split ones' slices for the
  // TpNewtonSchulz (in the NS dtype, as NewtonSchulz would cast them).
  std::vector<NsJob> jobs;
  std::vector<std::pair<int, at::Tensor>> tp_inputs;
  std::vector<size_t> position(indices.size());  // into jobs, or tp_inputs for split slots
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    bool owned = false;
    const at::Tensor update =
        MuonDirection(ScaledGrad(i, context.grad_scale), momentum_[i], hps_[i], &owned);
    if (tp_index_[i] >= 0) {
      position[k] = tp_inputs.size();
      tp_inputs.emplace_back(tp_index_[i],
                             update.to(NsScalarType(hps_[i].ns)).contiguous());
    } else {
      position[k] = jobs.size();
      jobs.push_back({update, &splits_[i], &hps_[i].ns});
    }
  }
  // 2. Newton–Schulz: matrices of one shape and the same options together (in slot order).
  const std::vector<std::vector<at::Tensor>> orthos = OrthogonalizeBlocks(jobs);
  std::vector<at::Tensor> tp_orthos;
  if (!tp_inputs.empty()) {
    ASSIGN_OR_RETURN(tp_orthos, tp_ns_->Orthogonalize(tp_inputs));
  }
  // 3. The updates.
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    const Held& h = slots_[i];
    const double lr = hps_[i].lr * context.lr_multiplier;
    if (tp_index_[i] >= 0) {
      ApplyTpOrtho(h.main, tp_orthos[position[k]], hps_[i], lr, h.slot.tp, global_shapes_[i],
                   splits_[i]);
    } else {
      ApplyOrthos(h.main, orthos[position[k]], hps_[i], lr, splits_[i]);
    }
    FinishUpdate(i);
  }
  return absl::OkStatus();
}

std::vector<SlotOptimizer::Field> Muon::Fields(size_t i) const {
  return {{"momentum_buffer", momentum_[i]}};
}

double Muon::ns_cost() const {
  double cost = tp_ns_ != nullptr ? tp_ns_->ns_cost() : 0.0;
  for (int64_t i = 0; i < num_slots(); ++i) {
    if (tp_index_[i] >= 0) continue;  // counted by tp_ns_
    cost += NsCost(slot(i).full_shape[0], slot(i).full_shape[1], splits_[i]);
  }
  return cost;
}

}  // namespace orthoshard::optimizers
