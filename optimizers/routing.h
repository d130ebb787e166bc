// Which optimizer updates which parameter. Pure planning: names and shapes in, decisions and a
// report out; no tensors. Rules, in order:
//   1. overrides: the first name pattern that matches decides (Muon only for 2-D params);
//   2. a param that is not 2-D (norm weights, biases, scalars, conv kernels) goes to AdamW;
//   3. a 2-D param whose name matches an `adamw_patterns` entry (embeddings, output head, norms,
//      biases, MoE routers and gates) goes to AdamW;
//   4. every other 2-D param is a hidden matrix and goes to Muon.
// Patterns are globs over the full param name where '*' matches any run of characters.
#ifndef ORTHOSHARD_OPTIMIZERS_ROUTING_H_
#define ORTHOSHARD_OPTIMIZERS_ROUTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace orthoshard::optimizers {

enum class Route { kMuon, kAdamW };

// "muon" or "adamw".
const char* RouteName(Route route);

struct RouteOverride {
  std::string pattern;  // glob over the param name
  Route route;
};

struct RoutingConfig {
  // 2-D params that are not hidden matrices, by name.
  // MoE routers and gates (Megatron: the router weight is not a hidden matrix) too.
  std::vector<std::string> adamw_patterns = {"*embed*", "*output_layer*", "*lm_head*", "*norm*",
                                             "*bias*",  "*router*",        "*expert_gate*"};
  // Checked before every other rule; the first match wins.
  std::vector<RouteOverride> overrides;
};

struct ParamDescriptor {
  std::string name;
  std::vector<int64_t> shape;
};

// True when `name` matches the glob `pattern` ('*' = any run of characters, possibly empty).
bool GlobMatch(absl::string_view pattern, absl::string_view name);

struct RoutingReport {
  struct Entry {
    std::string name;
    Route route;
    std::string reason;  // which rule decided, e.g. "2-D hidden matrix", "override '*.w'"
    int64_t numel = 0;
  };
  std::vector<Entry> entries;  // in the order the params were given
  int64_t muon_count = 0;
  int64_t muon_numel = 0;
  int64_t adamw_count = 0;
  int64_t adamw_numel = 0;

  // One summary line ("optimizer routing: muon 3 params / 1536 elements, adamw 2 params / 40
  // elements\n") then one line per param ("  layers.0.fc1.weight (128) -> muon (2-D hidden matrix)\n").
  std::string ToString() const;
};

// Routes every param. Errors: kInvalidArgument for a duplicate or empty name, or an override that
// sends a non-2-D param to Muon ("param 'b': override 'b*' routes it to muon, which needs a 2-D
// matrix, got shape [8]").
absl::StatusOr<RoutingReport> PlanRouting(const RoutingConfig& config,
                                          absl::Span<const ParamDescriptor> params);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_ROUTING_H_
