// Newton–Schulz coefficient schedules by name or list, without LibTorch (so configs can be
// validated where no tensor library is linked: integration/config:trainer_config).
#ifndef ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_
#define ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_

#include <array>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::optimizers {

// Coefficients (a, b, c) of one quintic iteration X <- a X + (b A + c A^2) X, A = X X^T.
using NsCoefficients = std::array<double, 3>;

struct NsSchedule {
  // Iteration i uses [NsCoefficientIndex(size, i, cycle)]: [min(i, size - 1)] (the last triple
  // repeats), or with `cycle` [i % size] (the table restarts after its last triple).
  std::vector<NsCoefficients> coefficients;
  double norm_scale = 1.0;  // see NewtonSchulzOptions::norm_scale
  bool cycle = false;
};

// The triple iteration i (from 0) of a schedule of `size` triples uses: min(i, size - 1), or with
// `cycle` i % size. Precondition: size > 0, i >= 0.
inline size_t NsCoefficientIndex(size_t size, int i, bool cycle) {
  const size_t step = static_cast<size_t>(i);
  return cycle ? step % size : (step < size ? step : size - 1);
}

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
//                    type);
//   "polar_express"  the five per-iteration triples of Polar Express (Amsel et al.,
//                    arXiv:2505.16932) as the modded-nanogpt speedrun and Dion publish them, with
//                    their 2% normalisation margin (norm_scale 1.02); the last repeats after five;
//   "quintic"        Megatron-LM's "quintic" (NVIDIA Emerging-Optimizers' muon_utils.py
//                    _COEFFICIENT_SETS, from modded-nanogpt's train_gpt_medium.py): five triples,
//                    norm_scale 1, cycled (iteration i uses triple i % 5), as Emerging-Optimizers'
//                    newton_schulz runs every table but polar_express;
//   "aol"            Megatron-LM's "aol" (the same file, from thib-s/flash-newton-schulz): four
//                    triples, norm_scale 1, cycled. They were fitted for an AOL-rescaled input;
//                    after the Frobenius normalisation Emerging-Optimizers (and this library) use,
//                    the first quintic has a root at s = 0.8837 and is negative above it, so a
//                    singular value above 0.8837 ||G||_F (a matrix whose top direction holds more
//                    than 78% of its squared norm) comes out with its sign flipped; and a restart
//                    of the cycle sends the converged singular values, near 1, to p(1) = -0.585,
//                    so CheckNsScheduleBounded accepts aol for exactly 4 iterations;
//   "a,b,c[;a,b,c...]" a triple or a per-iteration list (norm_scale 1, the last repeats).
// Errors: kInvalidArgument naming the text and the expected forms, or a coefficient outside
// [-kMaxNsCoefficient, kMaxNsCoefficient] with that range.
absl::StatusOr<NsSchedule> ParseNsSchedule(absl::string_view text);

// An upper bound of the singular values of the iterate over `steps` iterations of
// `coefficients` (iteration i uses [NsCoefficientIndex(size, i, cycle)]), starting from a matrix
// divided by norm_scale x its Frobenius norm (singular values in [0, 1 / norm_scale]): the largest
// M_k for M_0 = 1 / norm_scale, M_{k+1} = max |p_k(s)| over s in [0, M_k], computed exactly from
// p_k's critical points (p_k'(s) = a + 3 b s^2 + 5 c s^4 = 0). Exact-arithmetic bound; infinity once it
// passes the double range. Preconditions: coefficients non-empty, norm_scale > 0.
double NsSingularValueBound(const std::vector<NsCoefficients>& coefficients, double norm_scale,
                            int steps, bool cycle = false);

// OK when `steps` iterations keep NsSingularValueBound within kMaxNsSingularValue, keep every
// quintic from the second on non-negative on [0, M_k] (the singular values it can meet: a negative
// p(s) flips that direction, which the odd later iterations drive to -1, an update uphill; the
// first is exempt, see "aol" above), and, for a cycled schedule, run whole cycles (a restarted
// table meets singular values near 1 with its first quintic, fitted for small ones). Errors:
// kInvalidArgument naming the iteration, its triple and the bound or the negative value it
// reaches, with the accepted ones; or the cycle length and `steps`.
absl::Status CheckNsScheduleBounded(const std::vector<NsCoefficients>& coefficients,
                                    double norm_scale, int steps, bool cycle = false);

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_NS_SCHEDULE_H_
