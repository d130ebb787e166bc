#include "integration/checkpoint_model.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/tp_slices.h"
#include "common/status_macros.h"
#include "model/param_shapes.h"

namespace orthoshard::integration {

absl::StatusOr<model::SavedModel> CheckpointModel(const checkpoint::Manifest& manifest,
                                                  absl::string_view source) {
  const std::string where =
      absl::StrCat("checkpoint ", source, ": model config \"", manifest.model_config(), "\": ");
  absl::StatusOr<model::SavedModel> saved = model::ParseSavedModel(manifest.model_config());
  if (!saved.ok()) {
    return absl::Status(saved.status().code(), absl::StrCat(where, saved.status().message()));
  }
  ASSIGN_OR_RETURN(const std::vector<checkpoint::WholeParam> whole,
                   checkpoint::WholeParams(manifest, source));
  std::vector<model::SavedParam> params;
  params.reserve(whole.size());
  for (const checkpoint::WholeParam& p : whole) params.push_back({p.name, p.dtype, p.shape});
  if (absl::Status s = model::CheckSavedParams(*saved, params); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(where, s.message()));
  }
  return saved;
}

}  // namespace orthoshard::integration
