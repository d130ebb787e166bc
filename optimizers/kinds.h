// The fixed choices of the optimizers' configs (MuonHyper, NewtonSchulzOptions, ChainedConfig), in a
// header without LibTorch so that configuration code (integration/config) can name them.
#ifndef ORTHOSHARD_OPTIMIZERS_KINDS_H_
#define ORTHOSHARD_OPTIMIZERS_KINDS_H_

#include <string_view>

namespace orthoshard::optimizers {

// Muon's learning-rate scale per matrix shape [rows, cols].
enum class MuonScaleRule {
  kOriginal,       // sqrt(max(1, rows / cols))            (Keller Jordan; PyTorch "original")
  kMatchRmsAdamW,  // 0.2 * sqrt(max(rows, cols))          (Moonshot, arXiv:2502.16982)
  kSpectral,       // extra_scale * sqrt(max(rows, cols))  (Megatron-LM "spectral")
};

enum class NsDType { kBFloat16, kFloat32 };

// How the global gradient norm clips (ChainedConfig::clip_mode): kAllBeforeMomentum, one norm over
// every gradient clipping all of them, Muon's before its momentum (Megatron-LM); kExcludeMuon, the
// norm and the clip cover AdamW's params only.
enum class ClipMode { kAllBeforeMomentum, kExcludeMuon };

// How Muon orthogonalises a matrix split over the tensor-parallel group (common/tp_split.h;
// `--muon_tp_mode`). Params not split by TP are orthogonalised whole, as without TP, in every mode.
enum class MuonTpMode {
  // Each split matrix gets one home in the tp group (layout::AssignTpHomes over Newton–Schulz
  // costs): the slices go there in one all-to-all, the home runs Newton–Schulz on the whole
  // matrix, a second all-to-all returns each slice. Bitwise kDuplicated's result, 1/tp of the work.
  kOwner,
  // Megatron-LM's default: every tp rank all-gathers the slices and orthogonalises the whole
  // matrix, keeping its own slice (tp times the Newton–Schulz work).
  kDuplicated,
  // Megatron-LM's blockwise: each tp rank orthogonalises its slice as if it were the whole matrix,
  // scaled by the slice's shape; no communication, but the update changes with the tp size.
  kBlockwise,
};

// "owner", "duplicated", "blockwise".
inline const char* MuonTpModeName(MuonTpMode mode) {
  switch (mode) {
    case MuonTpMode::kOwner:
      return "owner";
    case MuonTpMode::kDuplicated:
      return "duplicated";
    case MuonTpMode::kBlockwise:
      return "blockwise";
  }
  return "?";
}

// Sets *mode from its name (MuonTpModeName); false (and *mode unchanged) for any other text.
inline bool ParseMuonTpMode(std::string_view name, MuonTpMode* mode) {
  for (MuonTpMode m : {MuonTpMode::kOwner, MuonTpMode::kDuplicated, MuonTpMode::kBlockwise}) {
    if (name == MuonTpModeName(m)) {
      *mode = m;
      return true;
    }
  }
  return false;
}

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_KINDS_H_
