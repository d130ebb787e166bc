// The fixed choices of the optimizers' configs (MuonHyper, NewtonSchulzOptions, ChainedConfig), in a
// header without LibTorch so that configuration code (integration/config) can name them.
#ifndef ORTHOSHARD_OPTIMIZERS_KINDS_H_
#define ORTHOSHARD_OPTIMIZERS_KINDS_H_

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

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_KINDS_H_
