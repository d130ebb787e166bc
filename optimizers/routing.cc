#include "optimizers/routing.h"

#include <unordered_set>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoshard::optimizers {
namespace {

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

const char* RouteName(Route route) { return route == Route::kMuon ? "muon" : "adamw"; }

bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  // Iterative wildcard match with one backtrack point (the last '*'), linear in practice.
  size_t p = 0, n = 0, star = absl::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string RoutingReport::ToString() const {
  std::string out = absl::StrCat("optimizer routing: muon ", muon_count, " params / ", muon_numel,
                                 " elements, adamw ", adamw_count, " params / ", adamw_numel,
                                 " elements\n");
  for (const Entry& e : entries) {
    absl::StrAppend(&out, "  ", e.name, " (", e.numel, ") -> ", RouteName(e.route), " (", e.reason,
                    ")\n");
  }
  return out;
}

absl::StatusOr<RoutingReport> PlanRouting(const RoutingConfig& config,
                                          absl::Span<const ParamDescriptor> params) {
  RoutingReport report;
  std::unordered_set<std::string> names;
  for (const ParamDescriptor& p : params) {
    if (p.name.empty()) return absl::InvalidArgumentError("param with an empty name");
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate param name '", p.name, "'"));
    }
    RoutingReport::Entry e{p.name, Route::kAdamW, "", Numel(p.shape)};
    const bool is_matrix = p.shape.size() == 2;
    bool decided = false;
    for (const RouteOverride& o : config.overrides) {
      if (!GlobMatch(o.pattern, p.name)) continue;
      if (o.route == Route::kMuon && !is_matrix) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': override '", o.pattern,
            "' routes it to muon, which needs a 2-D matrix, got shape ", Shape(p.shape)));
      }
      e.route = o.route;
      e.reason = absl::StrCat("override '", o.pattern, "'");
      decided = true;
      break;
    }
    if (!decided && !is_matrix) {
      e.reason = absl::StrCat(p.shape.size(), "-D, not a matrix");
      decided = true;
    }
    if (!decided) {
      for (const std::string& pattern : config.adamw_patterns) {
        if (!GlobMatch(pattern, p.name)) continue;
        e.reason = absl::StrCat("name matches '", pattern, "'");
        decided = true;
        break;
      }
    }
    if (!decided) {
      e.route = Route::kMuon;
      e.reason = "2-D hidden matrix";
    }
    if (e.route == Route::kMuon) {
      ++report.muon_count;
      report.muon_numel += e.numel;
    } else {
      ++report.adamw_count;
      report.adamw_numel += e.numel;
    }
    report.entries.push_back(std::move(e));
  }
  return report;
}

}  // namespace orthoshard::optimizers
