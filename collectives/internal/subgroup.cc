#include "collectives/internal/subgroup.h"

#include <algorithm>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/internal/c10d_communicator.h"
#include "common/status_macros.h"

namespace orthoshard::collectives::internal_collectives {
namespace {

absl::StatusOr<C10dOrigin*> Origin(Communicator& parent) {
  C10dOrigin* origin = OriginOf(parent);
  if (origin == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("subgroups need a communicator created by CreateGlooCommunicator or "
                     "CreateNcclCommunicator; this one (",
                     parent.backend_name(), ", rank ", parent.rank(), ") was not"));
  }
  return origin;
}

// Where `spec.ranks` are valid, the position of the parent's rank in them; else kInvalidArgument.
absl::StatusOr<int> RankInGroup(const Communicator& parent, const SubgroupSpec& spec) {
  absl::flat_hash_set<int> seen;
  for (int r : spec.ranks) {
    if (r < 0 || r >= parent.size() || !seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.label, ": ranks [", absl::StrJoin(spec.ranks, ", "),
                       "] are not distinct ranks in [0, ", parent.size(), ")"));
    }
  }
  const auto it = std::find(spec.ranks.begin(), spec.ranks.end(), parent.rank());
  if (it == spec.ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.label, ": rank ", parent.rank(),
                                                   " is not among the group's ranks [",
                                                   absl::StrJoin(spec.ranks, ", "), "]"));
  }
  return static_cast<int>(it - spec.ranks.begin());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(Communicator& parent,
                                                             const SubgroupSpec& spec) {
  ASSIGN_OR_RETURN(C10dOrigin * origin, Origin(parent));
  ASSIGN_OR_RETURN(const int rank, RankInGroup(parent, spec));
  GroupNaming naming;
  naming.label = spec.label;
  for (int r : spec.ranks) {
    const bool nested = !origin->naming.global_ranks.empty();
    naming.global_ranks.push_back(nested ? origin->naming.global_ranks[r] : r);
  }
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::PrefixStore>(spec.store_prefix, origin->store);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(spec.label, ": ", WhatOf(e)));
  }
  return ConnectC10dCommunicator(std::move(store), rank, static_cast<int>(spec.ranks.size()),
                                 origin->engine, std::move(naming));
}

absl::StatusOr<int64_t> NextSubgroupNamespace(Communicator& parent) {
  ASSIGN_OR_RETURN(C10dOrigin * origin, Origin(parent));
  return origin->namespaces_handed_out++;
}

}  // namespace orthoshard::collectives::internal_collectives
