// Subgroups of a communicator: a communicator of some of its ranks, on the same engine with the
// same options and timeouts, created by the same code (ConnectC10dCommunicator with the parent's
// Engine) over the parent's store under a prefix of the group's own. The mesh (collectives/mesh.h)
// builds its groups with it.
//
// c10d needs only a group's members to create it: a backend built directly over a store (not
// through torch.distributed.new_group, whose global group counter makes every rank call it, nor
// through NCCL's ncclCommSplit, a collective of the parent) rendezvouses among the ranks that use
// that store prefix. ProcessGroupGloo's own `split` does the same: a new ProcessGroupGloo over the
// store, called by the members only. So a rank creates only the groups it is in; since creation
// blocks until every member arrived, ranks must create their groups in an order that cannot
// deadlock (the mesh: one group per role, roles in a fixed order).
#ifndef ORTHOSHARD_COLLECTIVES_INTERNAL_SUBGROUP_H_
#define ORTHOSHARD_COLLECTIVES_INTERNAL_SUBGROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace orthoshard::collectives::internal_collectives {

struct SubgroupSpec {
  // The group's keys live under this prefix of the parent's store ("mesh/0/dp/1/"); it must be
  // the same on every member and differ from every other group's created over that parent.
  std::string store_prefix;
  // The parent's ranks in the group, in the order of their rank in it; must include the parent's
  // own rank, without repeats.
  std::vector<int> ranks;
  // Starts every message of the group's communicator ("tp group 1 [2, 3]").
  std::string label;
};

// Creates this rank's communicator for `spec.ranks` (rank = the position of parent.rank() in
// them), blocking until every member arrived or the engine's rendezvous timeout passed. Messages of
// the new communicator name ranks as "rank 1 (global 3)", global being the world communicator's
// rank. Errors: kInvalidArgument when `parent` was not created by this library's engines
// (CreateGlooCommunicator, CreateNcclCommunicator or this function) or `spec.ranks` is not a set of
// the parent's ranks holding its own; kDeadlineExceeded or kUnavailable when the rendezvous fails,
// with the engine's message.
absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(Communicator& parent,
                                                             const SubgroupSpec& spec);

// 0, 1, 2, ... on successive calls for the same `parent`: a name space for one batch of subgroups
// (the mesh puts it into its store prefixes), the same on every rank as long as every rank makes
// the same calls in the same order. Errors: kInvalidArgument as CreateSubgroup.
absl::StatusOr<int64_t> NextSubgroupNamespace(Communicator& parent);

}  // namespace orthoshard::collectives::internal_collectives

#endif  // ORTHOSHARD_COLLECTIVES_INTERNAL_SUBGROUP_H_
