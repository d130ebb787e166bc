#include "common/tp_split.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoshard {

std::string TpSplit::ToString() const {
  if (dim < 0) return "replicated";
  return absl::StrCat("dim ", dim, ", ", parts, parts == 1 ? " part" : " parts", ", rank ", rank,
                      " of ", size);
}

absl::Status ValidateTpSplit(const std::vector<int64_t>& global_shape, const TpSplit& split,
                             const std::string& what) {
  if (split.size < 1 || split.rank < 0 || split.rank >= split.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tp rank ", split.rank,
                                                   " is outside a tp group of ", split.size));
  }
  if (split.dim < 0) return absl::OkStatus();
  if (split.dim >= static_cast<int>(global_shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tp split dim ", split.dim, " is outside its shape [",
                     absl::StrJoin(global_shape, ", "), "]"));
  }
  if (split.parts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tp split needs at least 1 part, got ", split.parts));
  }
  const int64_t extent = global_shape[split.dim];
  if (extent % (split.parts * split.size) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": dim ", split.dim, " of shape [", absl::StrJoin(global_shape, ", "), "] (",
        extent, ") does not split into ", split.parts, " part(s) x tp ", split.size,
        " equal slices"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> TpLocalShape(std::vector<int64_t> global_shape, const TpSplit& split) {
  if (split.dim >= 0 && split.dim < static_cast<int>(global_shape.size())) {
    global_shape[split.dim] /= split.size;
  }
  return global_shape;
}

std::vector<int64_t> TpGlobalShape(std::vector<int64_t> local_shape, const TpSplit& split) {
  if (split.dim >= 0 && split.dim < static_cast<int>(local_shape.size())) {
    local_shape[split.dim] *= split.size;
  }
  return local_shape;
}

std::vector<std::pair<int64_t, int64_t>> TpRuns(int64_t global_extent, const TpSplit& split) {
  if (!split.split()) return {{0, global_extent}};
  const int64_t part = global_extent / split.parts;
  const int64_t slice = part / split.size;
  std::vector<std::pair<int64_t, int64_t>> runs;
  runs.reserve(split.parts);
  for (int64_t p = 0; p < split.parts; ++p) {
    const int64_t begin = p * part + split.rank * slice;
    runs.emplace_back(begin, begin + slice);
  }
  return runs;
}

}  // namespace orthoshard
