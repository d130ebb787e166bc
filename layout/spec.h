// Parsing a model spec (JSON, see model_spec.proto) into the ParamSpec list the planner takes.
#ifndef ORTHOSHARD_LAYOUT_SPEC_H_
#define ORTHOSHARD_LAYOUT_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/layout.h"

namespace orthoshard::layout {

// Parses `json` ({"params": [...]} in forward order). Errors, all kInvalidArgument and naming the
// entry as params[i] ('name'): malformed JSON or an unknown field (protobuf's message), no params,
// an unknown dtype or role. Shape and name checks are left to ComputeFullParamLayout.
absl::StatusOr<std::vector<ParamSpec>> ParseModelSpecJson(absl::string_view json);

// Reads and parses the file at `path`. Errors: kNotFound if it cannot be read, else as above with
// the path prefixed.
absl::StatusOr<std::vector<ParamSpec>> ReadModelSpecFile(const std::string& path);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_SPEC_H_
