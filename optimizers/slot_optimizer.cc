#include "optimizers/slot_optimizer.h"

#include <utility>

#include <ATen/ops/count_nonzero.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/repeat_interleave.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::optimizers {

namespace {

// per_slot(held) summed over `slots` in order; a LibTorch error becomes kInternal naming `what`.
template <typename T, typename Slots, typename PerSlot>
absl::StatusOr<T> SumOverSlots(const Slots& slots, absl::string_view what, PerSlot per_slot) {
  T sum{};
  try {
    for (const auto& held : slots) sum += per_slot(held);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  }
  return sum;
}

bool IsFloatOrBf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

absl::Status CheckGrad(const Slot& s) {
  if (!s.grad.defined()) return absl::OkStatus();
  if (!s.grad.sizes().equals(s.param.sizes())) {
    return absl::InvalidArgumentError(absl::StrCat("param '", s.name, "': grad shape ",
                                                   ShapeString(s.grad.sizes()), ", expected ",
                                                   ShapeString(s.param.sizes())));
  }
  if (!IsFloatOrBf16(s.grad)) {
    return absl::InvalidArgumentError(absl::StrCat("param '", s.name, "': grad dtype ",
                                                   c10::toString(s.grad.scalar_type()),
                                                   ", expected Float or BFloat16"));
  }
  return absl::OkStatus();
}

// The gradient as fp32, multiplied by `scale` when scale != 1 (a new tensor then; otherwise an fp32
// gradient is returned as is, so an unscaled step is bitwise PyTorch's).
at::Tensor GradAsFloat(const at::Tensor& grad, double scale) {
  at::Tensor g = grad.scalar_type() == at::kFloat ? grad : grad.to(at::kFloat);
  if (scale != 1.0) g = at::mul(g, scale);
  return g;
}

}  // namespace

absl::Status ValidateSplit(absl::string_view name, const FusedSplit& split, int64_t rows) {
  if (split.block_rows.empty()) return absl::OkStatus();
  if (split.num_groups <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': fused split num_groups must be > 0, got ", split.num_groups));
  }
  int64_t per_group = 0;
  for (int64_t r : split.block_rows) {
    if (r <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", name, "': fused split block rows must be > 0, got ", r));
    }
    per_group += r;
  }
  if (split.num_groups * per_group != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': fused split ", split.num_groups, " groups x ", per_group,
        " rows = ", split.num_groups * per_group, " rows, weight has ", rows));
  }
  return absl::OkStatus();
}

Slot Slot::Whole(std::string name, at::Tensor param, at::Tensor grad) {
  Slot s;
  s.name = std::move(name);
  if (param.defined()) s.full_shape = param.sizes().vec();
  s.saved_end = param.defined() ? param.numel() : 0;
  s.param = std::move(param);
  s.grad = std::move(grad);
  return s;
}

bool Slot::covers_whole() const {
  return offset == 0 && param.defined() && param.sizes().equals(full_shape);
}

absl::Status SlotOptimizer::Add(Slot slot) {
  if (slot.name.empty()) return absl::InvalidArgumentError("param with an empty name");
  const std::string& n = slot.name;
  if (!slot.param.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", n, "': tensor is undefined"));
  }
  if (!IsFloatOrBf16(slot.param)) {
    return absl::InvalidArgumentError(absl::StrCat("param '", n, "': dtype ",
                                                   c10::toString(slot.param.scalar_type()),
                                                   ", expected Float or BFloat16"));
  }
  if (!slot.param.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", n, "': must be contiguous"));
  }
  if (!slot.covers_whole() &&
      (slot.param.dim() != 1 || slot.offset < 0 ||
       slot.offset + slot.param.numel() > c10::multiply_integers(slot.full_shape))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", n, "': a part of shape ", ShapeString(slot.param.sizes()), " at offset ",
        slot.offset, " does not fit the whole param ", ShapeString(slot.full_shape),
        " (a part must be 1-D elements of it)"));
  }
  if (slot.saved_begin < 0 || slot.saved_begin > slot.saved_end ||
      slot.saved_end > slot.param.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", n, "': saved range [",
                                                   slot.saved_begin, ", ", slot.saved_end,
                                                   ") outside its ", slot.param.numel(),
                                                   " elements"));
  }
  RETURN_IF_ERROR(CheckGrad(slot));
  for (const Held& h : slots_) {
    if (h.slot.name == n) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate param name '", n, "'"));
    }
  }
  Held held;
  try {
    held.main = slot.param.scalar_type() == at::kFloat
                    ? slot.param
                    : slot.param.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("param '", n, "': ", e.what_without_backtrace()));
  }
  held.slot = std::move(slot);
  slots_.push_back(std::move(held));
  return absl::OkStatus();
}

absl::Status SlotOptimizer::Step(const StepContext& context) {
  std::vector<int64_t> all(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) all[i] = static_cast<int64_t>(i);
  return Step(context, all);
}

absl::Status SlotOptimizer::Step(const StepContext& context, absl::Span<const int64_t> indices) {
  for (const int64_t i : indices) {
    if (i < 0 || i >= num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind(), " step: slot ", i, " out of range [0, ", num_slots(), ")"));
    }
    RETURN_IF_ERROR(CheckGrad(slots_[i].slot));
  }
  std::vector<int64_t> stepped;
  for (const int64_t i : indices) {
    if (slots_[i].slot.grad.defined()) stepped.push_back(i);
  }
  try {
    return UpdateSlots(stepped, context);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(kind(), " step: ", e.what_without_backtrace()));
  }
}

absl::Status SlotOptimizer::UpdateSlots(absl::Span<const int64_t> indices,
                                        const StepContext& context) {
  for (const int64_t i : indices) {
    Update(i, ScaledGrad(i, context.grad_scale), context.lr_multiplier);
    FinishUpdate(i);
  }
  return absl::OkStatus();
}

void SlotOptimizer::FinishUpdate(size_t i) {
  Held& h = slots_[i];
  if (h.row_factors.defined()) {
    h.main.mul_(h.row_factors);
    h.row_factors = at::Tensor();
  }
  if (h.owns_main()) h.slot.param.copy_(h.main);
}

absl::StatusOr<bool> SlotOptimizer::SetRowScales(absl::string_view name,
                                                 const at::Tensor& row_scales) {
  bool held = false;
  for (Held& h : slots_) {
    const Slot& s = h.slot;
    if (s.name != name) continue;
    held = true;
    if (s.full_shape.size() != 2 || row_scales.dim() != 1 ||
        row_scales.numel() != s.full_shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", s.name, "' of shape ", ShapeString(s.full_shape), ": row scales of shape ",
          ShapeString(row_scales.sizes()), ", expected one per row of a 2-D param"));
    }
    try {
      const at::Tensor scales = row_scales.to(h.main.device(), at::kFloat);
      if (s.covers_whole()) {
        h.row_factors = scales.view({-1, 1});
        continue;
      }
      // The rows of elements [offset, offset + numel) and each element's factor.
      const int64_t cols = s.full_shape[1];
      const int64_t numel = s.numel();
      if (numel == 0 || cols == 0) continue;
      const int64_t first_row = s.offset / cols;
      const int64_t last_row = (s.offset + numel - 1) / cols;
      h.row_factors = scales.narrow(0, first_row, last_row - first_row + 1)
                          .repeat_interleave(cols)
                          .narrow(0, s.offset - first_row * cols, numel);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("param '", s.name, "': row scales: ",
                                              e.what_without_backtrace()));
    }
  }
  return held;
}

void SlotOptimizer::ClearRowScales() {
  for (Held& h : slots_) h.row_factors = at::Tensor();
}

at::Tensor SlotOptimizer::ScaledGrad(size_t i, double grad_scale) const {
  return GradAsFloat(slots_[i].slot.grad, grad_scale);
}

namespace {

// `t` (a slot's grad or main param), or with scope.saved_only the elements the slot saves; none
// of a param not split over tp under scope.skip_tp_replicated.
at::Tensor Counted(const Slot& s, const at::Tensor& t, const StatsScope& scope) {
  if (scope.skip_tp_replicated && !s.tp.split()) return t.reshape({-1}).narrow(0, 0, 0);
  if (!scope.saved_only) return t;
  return t.reshape({-1}).narrow(0, s.saved_begin, s.saved_end - s.saved_begin);
}

}  // namespace

absl::StatusOr<double> SlotOptimizer::GradSumSquares(const StatsScope& scope) const {
  return SumOverSlots<double>(slots_, "grad norm", [&scope](const Held& h) {
    if (!h.slot.grad.defined()) return 0.0;
    const double norm = at::linalg_vector_norm(Counted(h.slot, h.slot.grad, scope), 2,
                                               c10::nullopt, false, at::kFloat)
                            .item<double>();
    return norm * norm;
  });
}

absl::StatusOr<double> SlotOptimizer::ParamSumSquares(const StatsScope& scope) const {
  return SumOverSlots<double>(slots_, "param norm", [&scope](const Held& h) {
    const double norm =
        at::linalg_vector_norm(Counted(h.slot, h.main, scope), 2).item<double>();
    return norm * norm;
  });
}

absl::StatusOr<int64_t> SlotOptimizer::GradZeros(const StatsScope& scope) const {
  return SumOverSlots<int64_t>(slots_, "zero gradients", [&scope](const Held& h) -> int64_t {
    if (!h.slot.grad.defined()) return 0;
    const at::Tensor g = Counted(h.slot, h.slot.grad, scope);
    return g.numel() - at::count_nonzero(g).item<int64_t>();
  });
}

void SlotOptimizer::ExportState(std::vector<StateRecord>& out) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Held& h = slots_[i];
    const Slot& s = h.slot;
    const int64_t n = s.saved_end - s.saved_begin;
    // Nothing to save here: another rank saves these elements. A param of no elements has its
    // (empty) records and counters exported all the same, as torch.optim's state_dict keeps its
    // state: ImportState reads every field of every slot, and resuming must find them.
    if (n == 0 && c10::multiply_integers(s.full_shape) != 0) continue;
    auto piece = [&](const std::string& field, const at::Tensor& t) {
      out.push_back({absl::StrCat(s.name, "/", field), s.full_shape, s.offset + s.saved_begin,
                     t.reshape({-1}).narrow(0, s.saved_begin, n).clone()});
    };
    for (const Field& f : Fields(i)) {
      if (f.tensor.defined()) {
        piece(f.name, f.tensor);
      } else {
        out.push_back(CounterRecord(absl::StrCat(s.name, "/", f.name), f.counter));
      }
    }
    if (h.owns_main()) piece("main_param", h.main);
  }
}

absl::Status SlotOptimizer::ImportState(absl::Span<const StateRecord> state, bool validate_only) {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // destination, source
  std::vector<std::pair<size_t, std::pair<std::string, int64_t>>> counters;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Held& h = slots_[i];
    const Slot& s = h.slot;
    auto read = [&](const std::string& field, const at::Tensor& into) -> absl::Status {
      ASSIGN_OR_RETURN(at::Tensor t, ReadStateRange(state, absl::StrCat(s.name, "/", field),
                                                    s.full_shape, s.offset, s.numel(),
                                                    at::kFloat));
      copies.push_back({into, t.view(into.sizes())});
      return absl::OkStatus();
    };
    for (const Field& f : Fields(i)) {
      if (f.tensor.defined()) {
        RETURN_IF_ERROR(read(f.name, f.tensor));
      } else {
        ASSIGN_OR_RETURN(const int64_t v,
                         ReadStateCounter(state, absl::StrCat(s.name, "/", f.name)));
        counters.push_back({i, {f.name, v}});
      }
    }
    if (h.owns_main()) RETURN_IF_ERROR(read("main_param", h.main));
  }
  if (validate_only) return absl::OkStatus();
  for (auto& [dst, src] : copies) dst.copy_(src);
  for (auto& [i, counter] : counters) SetCounter(i, counter.first, counter.second);
  for (const Held& h : slots_) {
    if (h.owns_main()) h.slot.param.copy_(h.main);
  }
  return absl::OkStatus();
}

int64_t SlotOptimizer::numel() const {
  int64_t n = 0;
  for (const Held& h : slots_) n += h.main.numel();
  return n;
}

int64_t SlotOptimizer::state_bytes(
    const std::function<bool(absl::string_view name)>& include) const {
  int64_t bytes = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (include && !include(slots_[i].slot.name)) continue;
    if (slots_[i].owns_main()) bytes += static_cast<int64_t>(slots_[i].main.nbytes());
    for (const Field& f : Fields(i)) {
      if (f.tensor.defined()) bytes += static_cast<int64_t>(f.tensor.nbytes());
    }
  }
  return bytes;
}

}  // namespace orthoshard::optimizers
