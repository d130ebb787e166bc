#include "collectives/mesh.h"

#include <cassert>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/internal/subgroup.h"
#include "common/status_macros.h"

namespace orthoshard::collectives {
namespace {

// One of the grid's two rank layouts: four dimensions, innermost first, with a rank's coordinate
// along each. Dense: (tp, cp, dp, pp); experts: (tp, ep, expt_dp, pp). Both give the same rank.
struct Layout {
  std::array<int, 4> sizes;
  std::array<int, 4> coords;
  int dim;  // the role's dimension

  int Stride(int d) const {
    int stride = 1;
    for (int i = 0; i < d; ++i) stride *= sizes[i];
    return stride;
  }
  int Rank() const {
    int rank = 0;
    for (int d = 0; d < 4; ++d) rank += coords[d] * Stride(d);
    return rank;
  }
};

bool IsExpertRole(MeshRole role) { return role == MeshRole::kEp || role == MeshRole::kExptDp; }

Layout LayoutFor(const MeshGrid& grid, MeshRole role, int rank) {
  const MeshCoordinates c = CoordinatesOf(grid, rank);
  if (IsExpertRole(role)) {
    return {{grid.tp, grid.ep, grid.expt_dp(), grid.pp},
            {c.tp, c.ep, c.expt_dp, c.pp},
            role == MeshRole::kEp ? 1 : 2};
  }
  const int dim = role == MeshRole::kTp   ? 0
                  : role == MeshRole::kCp ? 1
                  : role == MeshRole::kDp ? 2
                                          : 3;
  return {{grid.tp, grid.cp, grid.dp, grid.pp}, {c.tp, c.cp, c.dp, c.pp}, dim};
}

std::string GridText(const MeshGrid& grid) {
  return absl::StrCat("tp ", grid.tp, " x cp ", grid.cp, " x dp ", grid.dp, " x pp ", grid.pp);
}

// "tp group 1 [2, 3]": labels the group's messages.
std::string GroupLabel(MeshRole role, int index, const std::vector<int>& ranks) {
  return absl::StrCat(MeshRoleName(role), " group ", index, " [", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace

const char* MeshRoleName(MeshRole role) {
  switch (role) {
    case MeshRole::kTp: return "tp";
    case MeshRole::kCp: return "cp";
    case MeshRole::kEp: return "ep";
    case MeshRole::kDp: return "dp";
    case MeshRole::kExptDp: return "expt_dp";
    case MeshRole::kPp: return "pp";
  }
  return "?";
}

int MeshGrid::SizeOf(MeshRole role) const {
  switch (role) {
    case MeshRole::kTp: return tp;
    case MeshRole::kCp: return cp;
    case MeshRole::kEp: return ep;
    case MeshRole::kDp: return dp;
    case MeshRole::kExptDp: return expt_dp();
    case MeshRole::kPp: return pp;
  }
  return 0;
}

int MeshCoordinates::Of(MeshRole role) const {
  switch (role) {
    case MeshRole::kTp: return tp;
    case MeshRole::kCp: return cp;
    case MeshRole::kEp: return ep;
    case MeshRole::kDp: return dp;
    case MeshRole::kExptDp: return expt_dp;
    case MeshRole::kPp: return pp;
  }
  return 0;
}

MeshGrid DataParallelGrid(int world_size) {
  MeshGrid grid;
  grid.dp = world_size;
  return grid;
}

absl::Status ValidateGrid(const MeshGrid& grid, int world_size) {
  const std::pair<const char*, int> sizes[] = {
      {"tp", grid.tp}, {"cp", grid.cp}, {"dp", grid.dp}, {"pp", grid.pp}, {"ep", grid.ep}};
  for (const auto& [name, size] : sizes) {
    if (size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh grid: ", name, " must be at least 1, got ", size));
    }
  }
  // In int64: a product of bad sizes may overflow int.
  const int64_t product = int64_t{grid.tp} * grid.cp * grid.dp * grid.pp;
  if (product != world_size) {
    const int64_t others = int64_t{grid.tp} * grid.cp * grid.pp;
    const std::string hint =
        world_size % others == 0 ? absl::StrCat(" (dp ", world_size / others, " would fit)") : "";
    return absl::InvalidArgumentError(absl::StrCat("mesh grid: ", GridText(grid), " = ", product,
                                                   " ranks, but the world has ", world_size, hint));
  }
  if ((grid.cp * grid.dp) % grid.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh grid: ep ", grid.ep, " must divide cp x dp = ", grid.cp * grid.dp,
                     " (Megatron's rule: the expert-parallel ranks are drawn from the context- and "
                     "data-parallel ranks)"));
  }
  return absl::OkStatus();
}

MeshCoordinates CoordinatesOf(const MeshGrid& grid, int rank) {
  assert(ValidateGrid(grid, grid.world_size()).ok() && rank >= 0 && rank < grid.world_size());
  MeshCoordinates c;
  c.tp = rank % grid.tp;
  const int middle = (rank / grid.tp) % (grid.cp * grid.dp);  // cp_i + cp·dp_i
  c.cp = middle % grid.cp;
  c.dp = middle / grid.cp;
  c.pp = rank / (grid.tp * grid.cp * grid.dp);
  c.ep = middle % grid.ep;
  c.expt_dp = middle / grid.ep;
  return c;
}

std::vector<int> GroupRanks(const MeshGrid& grid, MeshRole role, int rank) {
  Layout layout = LayoutFor(grid, role, rank);
  std::vector<int> ranks;
  for (int i = 0; i < layout.sizes[layout.dim]; ++i) {
    layout.coords[layout.dim] = i;
    ranks.push_back(layout.Rank());
  }
  return ranks;
}

int GroupIndex(const MeshGrid& grid, MeshRole role, int rank) {
  const Layout layout = LayoutFor(grid, role, rank);
  // Megatron's generate_masked_orthogonal_rank_groups: the other dimensions, innermost first.
  int index = 0, stride = 1;
  for (int d = 0; d < 4; ++d) {
    if (d == layout.dim) continue;
    index += layout.coords[d] * stride;
    stride *= layout.sizes[d];
  }
  return index;
}

absl::StatusOr<Mesh> Mesh::Create(Communicator& world, const MeshGrid& grid,
                                  const MeshOptions& options) {
  RETURN_IF_ERROR(ValidateGrid(grid, world.size()));
  ASSIGN_OR_RETURN(const int64_t mesh_id, internal_collectives::NextSubgroupNamespace(world));
  Mesh mesh;
  mesh.grid_ = grid;
  mesh.rank_ = world.rank();
  mesh.coordinates_ = CoordinatesOf(grid, mesh.rank_);
  for (MeshRole role : kMeshRoles) {
    const int r = static_cast<int>(role);
    mesh.group_ranks_[r] = GroupRanks(grid, role, mesh.rank_);
    const std::vector<int>& ranks = mesh.group_ranks_[r];
    if (options.share_equal_groups) {
      // Every member of the group decides alike: its group of each role is this same group.
      if (static_cast<int>(ranks.size()) == world.size()) {
        mesh.groups_[r] = &world;
        continue;
      }
      for (int earlier = 0; earlier < r && mesh.groups_[r] == nullptr; ++earlier) {
        if (mesh.group_ranks_[earlier] == ranks) mesh.groups_[r] = mesh.groups_[earlier];
      }
      if (mesh.groups_[r] != nullptr) continue;
    }
    const int index = GroupIndex(grid, role, mesh.rank_);
    internal_collectives::SubgroupSpec spec;
    spec.store_prefix = absl::StrCat("mesh/", mesh_id, "/", MeshRoleName(role), "/", index);
    spec.ranks = ranks;
    spec.label = GroupLabel(role, index, ranks);
    absl::StatusOr<std::unique_ptr<Communicator>> group =
        internal_collectives::CreateSubgroup(world, spec);
    if (!group.ok()) {
      return absl::Status(group.status().code(),
                          absl::StrCat("mesh: rank ", mesh.rank_, " creating its ", spec.label,
                                       ": ", group.status().message()));
    }
    mesh.owned_.push_back(*std::move(group));
    mesh.groups_[r] = mesh.owned_.back().get();
  }
  return mesh;
}

}  // namespace orthoshard::collectives
