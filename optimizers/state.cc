#include "optimizers/state.h"

#include <algorithm>
#include <map>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/accumulate.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace orthoshard::optimizers {
std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<at::Tensor> ReadStateRange(absl::Span<const StateRecord> pieces,
                                          const std::string& name,
                                          at::IntArrayRef full_shape, int64_t offset,
                                          int64_t numel, at::ScalarType dtype) {
  at::Tensor out = at::empty({numel}, dtype);
  const int64_t total = c10::multiply_integers(full_shape);
  std::vector<std::pair<int64_t, int64_t>> covered;
  bool found = false;
  for (const StateRecord& p : pieces) {
    if (p.name != name) continue;
    found = true;
    if (!full_shape.equals(p.full_shape)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state tensor '", name, "': expected shape ", ShapeString(full_shape),
                       ", received ", ShapeString(p.full_shape)));
    }
    if (!p.tensor.defined() || p.tensor.scalar_type() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state tensor '", name, "': expected dtype ", c10::toString(dtype), ", received ",
          p.tensor.defined() ? c10::toString(p.tensor.scalar_type()) : "<undefined>"));
    }
    const int64_t n = p.tensor.numel();
    if (p.offset < 0 || p.offset + n > total) {
      return absl::InvalidArgumentError(absl::StrCat("state tensor '", name, "': piece [",
                                                     p.offset, ", ", p.offset + n, ") outside ",
                                                     total, " elements"));
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

absl::StatusOr<int64_t> ReadStateCounter(absl::Span<const StateRecord> pieces,
                                         const std::string& name) {
  for (const StateRecord& p : pieces) {
    if (p.name != name) continue;
    if (!p.tensor.defined() || p.tensor.numel() != 1 || p.tensor.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state tensor '", name, "': expected an int64 scalar, received ",
          p.tensor.defined() ? absl::StrCat(c10::toString(p.tensor.scalar_type()), " ",
                                            ShapeString(p.tensor.sizes()))
                             : std::string("<undefined>")));
    }
    return p.tensor.item<int64_t>();
  }
  return absl::NotFoundError(absl::StrCat("missing state tensor '", name, "'"));
}

StateRecord CounterRecord(std::string name, int64_t value) {
  return {std::move(name), {}, 0, at::full({}, value, at::kLong)};
}

absl::StatusOr<std::vector<StateRecord>> AssembleModelSpace(absl::Span<const StateRecord> pieces) {
  std::map<std::string, const StateRecord*> first;
  for (const StateRecord& p : pieces) first.emplace(p.name, &p);
  std::vector<StateRecord> out;
  for (const auto& [name, p] : first) {
    if (p->full_shape.empty() && p->tensor.defined() && p->tensor.scalar_type() == at::kLong) {
      ASSIGN_OR_RETURN(const int64_t v, ReadStateCounter(pieces, name));
      out.push_back(CounterRecord(name, v));
      continue;
    }
    const at::ScalarType dtype = p->tensor.defined() ? p->tensor.scalar_type() : at::kFloat;
    const int64_t numel = c10::multiply_integers(p->full_shape);
    ASSIGN_OR_RETURN(at::Tensor whole,
                     ReadStateRange(pieces, name, p->full_shape, 0, numel, dtype));
    out.push_back({name, p->full_shape, 0, whole.view(p->full_shape)});
  }
  return out;
}

}  // namespace orthoshard::optimizers
