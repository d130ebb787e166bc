// Newton–Schulz coefficient schedules by name or list, without LibTorch (so configs can be
// validated where no tensor library is linked: integration/config:trainer_config).
#ifndef ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_
#define ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::optimizers {

// Coefficients (a, b, c) of one quintic iteration X <- a X + (b A + c A^2) X, A = X X^T.
using NsCoefficients = std::array<double, 3>;

struct NsSchedule {
  std::vector<NsCoefficients> coefficients;  // iteration i uses [min(i, size - 1)]
  double norm_scale = 1.0;                   // see NewtonSchulzOptions::norm_scale
};

// A schedule from its name or list:
//   "simple"         (3.4445, -4.7750, 2.0315) every iteration, norm_scale 1: Keller Jordan's
//                    iteration, torch.optim.Muon's default (Megatron-LM's "simple" coefficient
//                    type; its "quintic" and "aol" are other tables, refused by name);
//   "polar_express"  the five per-iteration triples of Polar Express (Amsel et al.,
//                    arXiv:2505.16932) as the modded-nanogpt speedrun and Dion publish them, with
//                    their 2% normalisation margin (norm_scale 1.02); the last repeats after five;
//   "a,b,c[;a,b,c...]" a triple or a per-iteration list (norm_scale 1).
// Errors: kInvalidArgument naming the text and the expected forms.
absl::StatusOr<NsSchedule> ParseNsSchedule(absl::string_view text);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_
