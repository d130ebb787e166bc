// The logical matrices of a fused 2-D weight, as Muon orthogonalises them: the same description as
// optimizers::FusedSplit and model::FusedSplit, in layout/ (which may not depend on either) so that
// planning can count Newton–Schulz work per logical matrix exactly as the optimizer does.
#ifndef ORTHOSHARD_LAYOUT_FUSED_BLOCKS_H_
#define ORTHOSHARD_LAYOUT_FUSED_BLOCKS_H_

#include <cstdint>
#include <vector>

namespace orthoshard::layout {

// A weight [num_groups * sum(block_rows), cols] viewed as [num_groups, sum(block_rows), cols];
// block j of every group together is one logical matrix [num_groups * block_rows[j], cols]:
//   fused QKV with G query groups, h heads per group, head dim d: {G, {h * d, d, d}} (Q, K, V)
//   SwiGLU fc1 [2 F, C] = [gate; up]:                            {1, {F, F}}
// Empty block_rows: the whole weight is one matrix.
struct FusedBlocks {
  int64_t num_groups = 1;
  std::vector<int64_t> block_rows;

  bool operator==(const FusedBlocks& other) const {
    return num_groups == other.num_groups && block_rows == other.block_rows;
  }
};

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_FUSED_BLOCKS_H_
