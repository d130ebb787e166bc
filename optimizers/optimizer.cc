#include "optimizers/optimizer.h"

#include <numeric>
#include <utility>

#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mul.h>
#include <c10/util/Exception.h>

#include <unordered_set>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoshard::optimizers {
namespace {

bool IsFloatOrBf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

}  // namespace

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

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

absl::Status CheckGrad(const Param& p) {
  if (!p.grad.defined()) return absl::OkStatus();
  if (!p.grad.sizes().equals(p.param.sizes())) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': grad shape ",
                                                   ShapeString(p.grad.sizes()), ", expected ",
                                                   ShapeString(p.param.sizes())));
  }
  if (!IsFloatOrBf16(p.grad)) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': grad dtype ",
                                                   c10::toString(p.grad.scalar_type()),
                                                   ", expected Float or BFloat16"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MainParam> MakeMainParam(Param p) {
  if (p.name.empty()) return absl::InvalidArgumentError("param with an empty name");
  if (!p.param.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': tensor is undefined"));
  }
  if (!IsFloatOrBf16(p.param)) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': dtype ",
                                                   c10::toString(p.param.scalar_type()),
                                                   ", expected Float or BFloat16"));
  }
  if (!p.param.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "': must be contiguous"));
  }
  if (absl::Status s = CheckGrad(p); !s.ok()) return s;
  MainParam out;
  try {
    out.main = p.param.scalar_type() == at::kFloat
                   ? p.param
                   : p.param.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("param '", p.name, "': ", e.what_without_backtrace()));
  }
  out.param = std::move(p);
  return out;
}

at::Tensor GradAsFloat(const at::Tensor& grad, double scale) {
  at::Tensor g = grad.scalar_type() == at::kFloat ? grad : grad.to(at::kFloat);
  if (scale != 1.0) g = at::mul(g, scale);
  return g;
}

void SyncModelParam(const MainParam& p) {
  if (p.owns_main()) p.param.param.copy_(p.main);
}

absl::StatusOr<double> LocalGradSumSquares(absl::Span<const MainParam> params) {
  double sum = 0.0;
  try {
    for (const MainParam& p : params) {
      if (!p.param.grad.defined()) continue;
      const double norm =
          at::linalg_vector_norm(p.param.grad, 2, c10::nullopt, false, at::kFloat).item<double>();
      sum += norm * norm;
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("grad norm: ", e.what_without_backtrace()));
  }
  return sum;
}

absl::StatusOr<at::Tensor> FindState(absl::Span<const NamedTensor> state, const std::string& name,
                                     const at::Tensor& like) {
  for (const NamedTensor& t : state) {
    if (t.name != name) continue;
    if (!t.tensor.defined() || !t.tensor.sizes().equals(like.sizes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state tensor '", name, "' has shape ",
          t.tensor.defined() ? ShapeString(t.tensor.sizes()) : std::string("<undefined>"),
          ", expected ", ShapeString(like.sizes())));
    }
    if (t.tensor.scalar_type() != like.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state tensor '", name, "' has dtype ", c10::toString(t.tensor.scalar_type()),
          ", expected ", c10::toString(like.scalar_type())));
    }
    return t.tensor;
  }
  return absl::NotFoundError(absl::StrCat("missing state tensor '", name, "'"));
}

absl::Status CheckNoUnexpectedState(absl::Span<const NamedTensor> state,
                                    const std::vector<std::string>& expected) {
  std::unordered_set<std::string> names(expected.begin(), expected.end());
  for (const NamedTensor& t : state) {
    if (names.count(t.name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected state tensor '", t.name, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::optimizers
