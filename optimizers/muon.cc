#include "optimizers/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros_like.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "optimizers/internal/fused_elementwise.h"

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
  for (double c : hp.ns.coefficients) {
    if (!std::isfinite(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Muon: Newton-Schulz coefficients must be finite, got ", c));
    }
  }
  if (hp.scale_rule == MuonScaleRule::kSpectral && !(hp.extra_scale > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon: extra_scale must be > 0 for the spectral rule, got ", hp.extra_scale));
  }
  return absl::OkStatus();
}

namespace {

at::ScalarType NsScalarType(const NewtonSchulzOptions& options) {
  return options.dtype == NsDType::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

// NewtonSchulz on `x`, already in the NS dtype and owned by the caller (normalised in place).
at::Tensor NewtonSchulzInPlace(at::Tensor x, const NewtonSchulzOptions& options) {
  // Op for op torch/optim/_muon.py `_zeropower_via_newtonschulz`.
  const auto [a, b, c] = options.coefficients;
  const bool transpose = x.size(0) > x.size(1);
  if (transpose) x = x.t();
  x.div_(at::linalg_vector_norm(x, 2).clamp(options.eps));
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
    at::mm_out(gram, x, x.t());                          // A = X X^T, m = min(rows, cols)
    at::addmm_out(gram_update, gram, gram, gram, b, c);  // b A + c A^2
    at::addmm_out(spare, x, gram_update, x, a);          // a X + (b A + c A^2) X
    x = spare;
    std::swap(spare, other);
  }
  return transpose ? x.t() : x;
}

}  // namespace

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

void MuonUpdate(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum_buffer,
                const MuonHyper& hp, double lr, const FusedSplit& split) {
  // The momentum, Nesterov and cast-to-NS-dtype steps run as one fused pass on dense CPU tensors
  // (bitwise equal to the ATen ops in the else branch; see internal/fused_elementwise.h).
  at::Tensor update;
  bool update_owned = false;  // update is a fresh tensor in the NS dtype (no copy needed)
  if (internal::CanFuseMomentum(momentum_buffer, grad, hp.momentum)) {
    update = internal::FusedMomentum(momentum_buffer, grad, hp.momentum, hp.nesterov,
                                     NsScalarType(hp.ns));
    update_owned = true;
  } else {
    momentum_buffer.lerp_(grad, 1.0 - hp.momentum);
    update = hp.nesterov ? at::lerp(grad, momentum_buffer, hp.momentum) : momentum_buffer;
  }
  const int64_t cols = param.size(1);
  if (split.block_rows.empty()) {
    const at::Tensor ortho =
        update_owned ? NewtonSchulzInPlace(update, hp.ns) : NewtonSchulz(update, hp.ns);
    const double adjusted_lr = lr * MuonLrScale(param.size(0), cols, hp);
    const double decay = 1.0 - lr * hp.weight_decay;
    if (internal::CanFuseDecayAdd(param, ortho)) {
      internal::FusedDecayAdd(param, decay, ortho, -adjusted_lr);
    } else {
      param.mul_(decay);
      param.add_(ortho, -adjusted_lr);
    }
    return;
  }
  // Fused weight: view [G, R, cols] and orthogonalise block j of all groups as one matrix.
  const int64_t groups = split.num_groups;
  const int64_t rows_per_group = param.size(0) / groups;
  const at::Tensor update3 = update.view({groups, rows_per_group, cols});
  std::vector<at::Tensor> orthos;
  int64_t offset = 0;
  for (int64_t r : split.block_rows) {
    orthos.push_back(
        NewtonSchulz(update3.narrow(1, offset, r).reshape({groups * r, cols}), hp.ns));
    offset += r;
  }
  param.mul_(1.0 - lr * hp.weight_decay);
  const at::Tensor param3 = param.view({groups, rows_per_group, cols});
  offset = 0;
  for (size_t j = 0; j < orthos.size(); ++j) {
    const int64_t r = split.block_rows[j];
    const double adjusted_lr = lr * MuonLrScale(groups * r, cols, hp);
    param3.narrow(1, offset, r).add_(orthos[j].reshape({groups, r, cols}), -adjusted_lr);
    offset += r;
  }
}

absl::StatusOr<std::unique_ptr<Muon>> Muon::Create(std::vector<Entry> entries) {
  std::unique_ptr<Muon> opt(new Muon());
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
    RETURN_IF_ERROR(ValidateSplit(added.name, e.split, added.full_shape[0]));
    opt->hps_.push_back(e.hp);
    opt->splits_.push_back(std::move(e.split));
    opt->momentum_.push_back(at::zeros_like(opt->slots_.back().main));
  }
  return opt;
}

std::vector<std::string> Muon::FieldNames() const { return {"momentum_buffer", "main_param"}; }

void Muon::Update(size_t i, const at::Tensor& grad, double lr_multiplier) {
  MuonUpdate(slots_[i].main, grad, momentum_[i], hps_[i], hps_[i].lr * lr_multiplier, splits_[i]);
}

std::vector<SlotOptimizer::Field> Muon::Fields(size_t i) const {
  return {{"momentum_buffer", momentum_[i]}};
}

}  // namespace orthoshard::optimizers
