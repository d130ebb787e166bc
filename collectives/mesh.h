// A mesh of named process groups: from the world communicator and a rank grid, one Communicator per
// parallelism role (tp, cp, ep, dp, expt_dp, pp) holding this rank's group of that role, each on
// the world's engine (c10d Gloo on CPU, NCCL on GPU) with the world's options and timeouts.
//
// The grid follows Megatron-LM's RankGenerator with its default order "tp-cp-ep-dp-pp" (and the
// expert tensor-parallel size equal to tp). Dense ranks, tp innermost, pp outermost:
//
//   world = tp × cp × dp × pp        rank = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i))
//
// Experts cut the same ranks differently (Megatron's expert RankGenerator: cp folded into the
// data-parallel ranks): the cp × dp ranks that share (tp_i, pp_i) are split into ep × expt_dp,
// ep innermost, so ep must divide cp × dp:
//
//   expt_dp = cp·dp / ep = world / (tp·ep·pp)      m = cp_i + cp·dp_i = ep_i + ep·expt_dp_i
//
// A role's group holds the ranks whose coordinates differ from this rank's only in that role's
// coordinate (for ep and expt_dp: the expert coordinates, tp_i and pp_i equal); a rank's rank in
// the group is its coordinate, so the group's global ranks are ascending. Groups of a role are
// numbered as Megatron enumerates them: by the other coordinates, innermost first. Example:
//
//   world 4 = tp 2 × dp 2            ranks (tp_i, dp_i): 0=(0,0) 1=(1,0) 2=(0,1) 3=(1,1)
//     tp groups 0={0,1} 1={2,3}      dp groups 0={0,2} 1={1,3}
//     cp, ep, pp: {r} each           expt_dp (ep 1): the dp groups
//
// Megatron's data-parallel group "with context parallel" (dp × cp, where dense grads are reduced
// when cp > 1) is not a role yet: with cp = 1 it is dp.
//
// Communicators. Each group is a subgroup of the world (internal/subgroup.h): a c10d backend over
// the world's store under the prefix "mesh/<n>/<role>/<group index>" (n counts the meshes created
// over this world communicator), with the world's collective and rendezvous timeouts, its own
// collective sequence numbers, progress keys and traffic counters. A group of size 1 is a real
// communicator of one rank. With MeshOptions::share_equal_groups (the default), roles whose groups
// hold the same ranks share one communicator: a role whose group is the whole world IS the world
// communicator (a 1-D grid, dp = world, is today's single data-parallel group and costs nothing),
// and e.g. expt_dp is dp's communicator when ep = 1 and cp = 1; such roles share sequence numbers
// and traffic counters. Errors of a subgroup start with its label ("tp group 1 [2, 3]: ...") and
// name ranks as "rank 1 (global 3)": the rank in the group, then the world communicator's rank.
//
// Cross-rank contract: Mesh::Create is collective over the world: every rank calls it with the
// same grid and options, in the same order relative to its other Mesh::Create calls on that world.
// It creates this rank's group of every role, roles in the order tp, cp, ep, dp, expt_dp, pp; a
// rank does not take part in groups it is not in (c10d needs only a group's members). Each group's
// communicator then follows communicator.h's contract among its members; roles that share a
// communicator also share its order. Not thread-safe.
#ifndef ORTHOSHARD_COLLECTIVES_MESH_H_
#define ORTHOSHARD_COLLECTIVES_MESH_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace orthoshard::collectives {

enum class MeshRole { kTp, kCp, kEp, kDp, kExptDp, kPp };
inline constexpr int kNumMeshRoles = 6;
// Every role, in the order Mesh::Create creates their groups.
inline constexpr std::array<MeshRole, kNumMeshRoles> kMeshRoles = {
    MeshRole::kTp, MeshRole::kCp, MeshRole::kEp, MeshRole::kDp, MeshRole::kExptDp, MeshRole::kPp};
const char* MeshRoleName(MeshRole role);  // "tp", "cp", "ep", "dp", "expt_dp", "pp"

// Sizes of the parallel dimensions; see the file comment for the rank mapping.
struct MeshGrid {
  int tp = 1;  // tensor parallel: innermost (consecutive ranks)
  int cp = 1;  // context parallel
  int dp = 1;  // data parallel, for dense params
  int pp = 1;  // pipeline parallel: outermost
  int ep = 1;  // expert parallel: splits cp × dp; must divide it

  int world_size() const { return tp * cp * dp * pp; }
  // Expert data parallel: cp × dp / ep.
  int expt_dp() const { return ep > 0 ? cp * dp / ep : 0; }
  // The size of `role`'s groups.
  int SizeOf(MeshRole role) const;
};

// The 1-D grid of today's single data-parallel group: dp = world_size, every other size 1.
MeshGrid DataParallelGrid(int world_size);

// A rank's coordinate along every role, each in [0, the role's size).
struct MeshCoordinates {
  int tp = 0, cp = 0, dp = 0, pp = 0;  // dense
  int ep = 0, expt_dp = 0;             // experts (tp and pp as above)

  int Of(MeshRole role) const;
};

// OK when `grid` fits a world of `world_size` ranks. Errors (kInvalidArgument): a size below 1
// ("mesh grid: tp must be at least 1, got 0"); a product other than the world size ("mesh grid:
// tp 2 x cp 1 x dp 3 x pp 1 = 6 ranks, but the world has 4 (dp 2 would fit)"); ep not dividing
// cp x dp ("mesh grid: ep 3 must divide cp x dp = 4 (Megatron's rule: ...)").
absl::Status ValidateGrid(const MeshGrid& grid, int world_size);

// Pure functions of a valid grid (ValidateGrid OK) and a rank in [0, world_size); anything else is
// a caller bug (assert).
MeshCoordinates CoordinatesOf(const MeshGrid& grid, int rank);
// The global ranks of `rank`'s group of `role`, ascending (= by rank in the group).
std::vector<int> GroupRanks(const MeshGrid& grid, MeshRole role, int rank);
// Which of `role`'s world_size / SizeOf(role) groups holds `rank`, as Megatron numbers them.
int GroupIndex(const MeshGrid& grid, MeshRole role, int rank);

struct MeshOptions {
  // Roles whose groups hold the same ranks share one communicator, and a role whose group is the
  // whole world uses the world communicator itself. False: every role gets a communicator of its
  // own (separate sequence numbers and traffic counters per role, one more engine instance each).
  bool share_equal_groups = true;
};

class Mesh {
 public:
  // Validates `grid` against world.size() and creates this rank's group of every role (see the
  // file comment for the cross-rank contract). Blocks until every member of each group arrived,
  // each group bounded by the world's rendezvous timeout. `world` must outlive the Mesh (roles may
  // use it). Errors: ValidateGrid's; kInvalidArgument when `world` was not created by
  // CreateGlooCommunicator, CreateNcclCommunicator or as a mesh group; kDeadlineExceeded
  // or kUnavailable when a group's rendezvous fails, starting "mesh: rank 2 creating its tp group
  // 1 [2, 3]: " and carrying the engine's message.
  static absl::StatusOr<Mesh> Create(Communicator& world, const MeshGrid& grid,
                                     const MeshOptions& options = {});

  Mesh(Mesh&&) = default;
  Mesh& operator=(Mesh&&) = default;

  // This rank's group of `role`; its rank() is Coordinates().Of(role).
  Communicator& group(MeshRole role) const { return *groups_[static_cast<int>(role)]; }
  Communicator& tp() const { return group(MeshRole::kTp); }
  Communicator& cp() const { return group(MeshRole::kCp); }
  Communicator& ep() const { return group(MeshRole::kEp); }
  Communicator& dp() const { return group(MeshRole::kDp); }
  Communicator& expt_dp() const { return group(MeshRole::kExptDp); }
  Communicator& pp() const { return group(MeshRole::kPp); }

  const MeshGrid& grid() const { return grid_; }
  int rank() const { return rank_; }  // in the world communicator
  const MeshCoordinates& coordinates() const { return coordinates_; }
  // The world ranks of this rank's group of `role`, ascending.
  const std::vector<int>& group_ranks(MeshRole role) const {
    return group_ranks_[static_cast<int>(role)];
  }
  // Which of `role`'s groups this rank's is (GroupIndex).
  int group_index(MeshRole role) const { return GroupIndex(grid_, role, rank_); }

 private:
  Mesh() = default;

  MeshGrid grid_;
  int rank_ = 0;
  MeshCoordinates coordinates_;
  std::array<std::vector<int>, kNumMeshRoles> group_ranks_;
  std::array<Communicator*, kNumMeshRoles> groups_{};  // into owned_ or the world
  std::vector<std::unique_ptr<Communicator>> owned_;
};

}  // namespace orthoshard::collectives

#endif  // ORTHOSHARD_COLLECTIVES_MESH_H_
