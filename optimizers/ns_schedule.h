// Newton–Schulz coefficient schedules by name or list, without LibTorch (so configs can be
// validated where no tensor library is linked: integration/config:trainer_config).
#ifndef ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_
#define ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_

#include <array>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::optimizers {

// Coefficients (a, b, c) of one quintic iteration X <- a X + (b A + c A^2) X, A = X X^T.
using NsCoefficients = std::array<double, 3>;

struct NsSchedule {
  std::vector<NsCoefficients> coefficients;  // iteration i uses [min(i, size - 1)]
  double norm_scale = 1.0;                   // see NewtonSchulzOptions::norm_scale
};

// The largest coefficient magnitude a schedule may use. In the bf16 iteration each of the terms
// a X, b A X and c A^2 X is rounded with a relative error of up to 2^-8 (bf16's unit roundoff),
// and at singular value 1 a term is as large as its coefficient: a coefficient of 2^10 leaves an
// error of up to 4, more than the singular values (driven to 1) being computed, so no schedule
// that works in bf16 needs a larger one; published ones stay under 23 (polar_express's -22.48).
// With singular values bounded by kMaxNsSingularValue = 2^4 the terms stay below
// 3 x 2^10 x (2^4)^5 < 2^32, far from fp32's and bf16's overflow at 2^128 (both have 8 exponent
// bits). A scalar that fp32 cannot hold at all (a coefficient of 1e39) makes LibTorch throw in
// the middle of a step.
inline constexpr double kMaxNsCoefficient = 1024;

// The most any singular value of the iterate may reach over a schedule's iterations
// (NsSingularValueBound). The iteration maps each singular value s of X to |p(s)|, p(s) = a s +
// b s^3 + c s^5, starting from [0, 1] (X is divided by its Frobenius norm); schedules meant to
// converge to 1 overshoot at most to 1.21 (simple) or 1.99 (polar_express's first quintic). Past a
// few units the c s^5 term dominates and each further iteration raises them to about the 5th
// power: a schedule whose iterate reaches 16 has left the convergent regime and passes fp32's
// 2^128 within two or three more iterations. 16 leaves 8x polar_express's overshoot as margin for
// the bf16 iteration's rounding.
inline constexpr double kMaxNsSingularValue = 16;

// A schedule from its name or list:
//   "simple"         (3.4445, -4.7750, 2.0315) every iteration, norm_scale 1: Keller Jordan's
//                    iteration, torch.optim.Muon's default (Megatron-LM's "simple" coefficient
//                    type; its "quintic" and "aol" are other tables, refused by name);
//   "polar_express"  the five per-iteration triples of Polar Express (Amsel et al.,
//                    arXiv:2505.16932) as the modded-nanogpt speedrun and Dion publish them, with
//                    their 2% normalisation margin (norm_scale 1.02); the last repeats after five;
//   "a,b,c[;a,b,c...]" a triple or a per-iteration list (norm_scale 1).
// Errors: kInvalidArgument naming the text and the expected forms, or a coefficient outside
// [-kMaxNsCoefficient, kMaxNsCoefficient] with that range.
absl::StatusOr<NsSchedule> ParseNsSchedule(absl::string_view text);

// An upper bound of the singular values of the iterate over `steps` iterations of
// `coefficients` (iteration i uses [min(i, size - 1)]), starting from a matrix divided by
// norm_scale x its Frobenius norm (singular values in [0, 1 / norm_scale]): the largest M_k for
// M_0 = 1 / norm_scale, M_{k+1} = max |p_k(s)| over s in [0, M_k], computed exactly from p_k's
// critical points (p_k'(s) = a + 3 b s^2 + 5 c s^4 = 0). Exact-arithmetic bound; infinity once it
// passes the double range. Preconditions: coefficients non-empty, norm_scale > 0.
double NsSingularValueBound(const std::vector<NsCoefficients>& coefficients, double norm_scale,
                            int steps);

// OK when `steps` iterations keep NsSingularValueBound within kMaxNsSingularValue. Errors:
// kInvalidArgument naming the iteration that leaves it, the bound it reaches and the accepted one.
absl::Status CheckNsScheduleBounded(const std::vector<NsCoefficients>& coefficients,
                                    double norm_scale, int steps);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_
