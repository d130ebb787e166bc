#include "optimizers/ns_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace orthoshard::optimizers {

absl::StatusOr<NsSchedule> ParseNsSchedule(absl::string_view schedule) {
  if (schedule == "simple") {
    return NsSchedule{{{3.4445, -4.7750, 2.0315}}, 1.0};
  }
  if (schedule == "polar_express") {
    // Amsel, Persson, Musco, Gower, "The Polar Express" (arXiv:2505.16932): each iteration's
    // quintic is fitted to the singular-value interval the previous ones left, with a safety
    // margin; the table as the modded-nanogpt speedrun publishes it. optimizers:oracle_test runs
    // it bitwise against testdata/torch_oracle.py, which types the published table
    // independently and checks that it converges to the SVD polar factor.
    return NsSchedule{{{8.156554524902461, -22.48329292557795, 15.878769915207462},
                       {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                       {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                       {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                       {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}},
                      1.02};
  }
  // Megatron-LM's tables, digit for digit NVIDIA Emerging-Optimizers'
  // emerging_optimizers/orthogonalized_optimizers/muon_utils.py _COEFFICIENT_SETS (checked against
  // commit a045ea1), which normalises by the Frobenius norm clamped at eps = 1e-7
  // (F.normalize) as torch.optim.Muon does, and cycles every table but polar_express
  // (get_coefficient_iterator's "cycle"). optimizers:oracle_test runs both against
  // testdata/torch_oracle.py, which types them independently.
  if (schedule == "quintic") {
    // From modded-nanogpt's train_gpt_medium.py (Keller Jordan; the derivation is
    // leloykun.github.io/ponder/muon-opt-coeffs).
    return NsSchedule{{{4.0848, -6.8946, 2.9270},
                       {3.9505, -6.3029, 2.6377},
                       {3.7418, -5.5913, 2.3037},
                       {2.8769, -3.1427, 1.2046},
                       {2.8366, -3.0525, 1.2012}},
                      1.0, /*cycle=*/true};
  }
  if (schedule == "aol") {
    // From thib-s/flash-newton-schulz (fitted there for an AOL-rescaled input; see the header).
    return NsSchedule{{{4.0098, -7.0585, 2.4635},
                       {3.4585, -5.5479, 2.5959},
                       {2.7573, -3.2939, 1.4254},
                       {2.7215, -3.0494, 1.3169}},
                      1.0, /*cycle=*/true};
  }
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Newton-Schulz coefficients '", schedule, "': ", why,
        "; expected simple, polar_express, quintic, aol, or a,b,c[;a,b,c...] (one triple per "
        "iteration)"));
  };
  std::vector<NsCoefficients> triples;
  for (absl::string_view part : absl::StrSplit(schedule, ';')) {
    std::vector<absl::string_view> numbers = absl::StrSplit(part, ',');
    if (numbers.size() != 3) return bad(absl::StrCat("'", part, "' is not three numbers"));
    NsCoefficients triple;
    for (int i = 0; i < 3; ++i) {
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(numbers[i]), &triple[i]) ||
          !std::isfinite(triple[i])) {
        return bad(absl::StrCat("'", numbers[i], "' is not a finite number"));
      }
      if (std::abs(triple[i]) > kMaxNsCoefficient) {
        return bad(absl::StrCat("coefficient ", triple[i], " is outside the accepted [-",
                                kMaxNsCoefficient, ", ", kMaxNsCoefficient, "]"));
      }
    }
    triples.push_back(triple);
  }
  return NsSchedule{std::move(triples), 1.0};
}

namespace {

// The extremes of p(s) = a s + b s^3 + c s^5 over s in [0, m]: at 0, at m or at a critical point
// inside, where p'(s) = a + 3 b s^2 + 5 c s^4 = 0 (a quadratic in s^2).
struct QuinticExtremes {
  double max_abs = 0;   // max |p(s)|
  double min = 0;       // min p(s) (p(0) = 0, so <= 0)
  double argmin = 0;    // where p reaches it
};
QuinticExtremes Extremes(const NsCoefficients& coefficients, double m) {
  const auto [a, b, c] = coefficients;
  const auto p = [&](double s) { return s * (a + s * s * (b + s * s * c)); };
  QuinticExtremes out;
  const auto visit = [&](double s) {
    const double value = p(s);
    out.max_abs = std::max(out.max_abs, std::abs(value));
    if (value < out.min) {
      out.min = value;
      out.argmin = s;
    }
  };
  visit(m);
  const auto try_square = [&](double s2) {
    if (s2 > 0 && s2 < m * m) visit(std::sqrt(s2));
  };
  if (c != 0) {
    const double discriminant = 9 * b * b - 20 * a * c;
    if (discriminant >= 0) {
      try_square((-3 * b + std::sqrt(discriminant)) / (10 * c));
      try_square((-3 * b - std::sqrt(discriminant)) / (10 * c));
    }
  } else if (b != 0) {
    try_square(-a / (3 * b));
  }
  if (std::isnan(p(m))) out.max_abs = NAN;
  return out;
}

}  // namespace

double NsSingularValueBound(const std::vector<NsCoefficients>& coefficients, double norm_scale,
                            int steps, bool cycle) {
  double m = 1.0 / norm_scale;
  double most = m;
  for (int i = 0; i < steps && std::isfinite(most); ++i) {
    m = Extremes(coefficients[NsCoefficientIndex(coefficients.size(), i, cycle)], m).max_abs;
    most = std::max(most, std::isnan(m) ? HUGE_VAL : m);
  }
  return most;
}

absl::Status CheckNsScheduleBounded(const std::vector<NsCoefficients>& coefficients,
                                    double norm_scale, int steps, bool cycle) {
  const int cycle_length = static_cast<int>(coefficients.size());
  if (cycle && steps % cycle_length != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a table of ", cycle_length, " Newton-Schulz iterations that restarts after its last "
        "(cycled) over ", steps, " iterations would meet singular values near 1 with its first "
        "quintic, fitted for small ones; accepted: a multiple of ", cycle_length, " iterations"));
  }
  double m = 1.0 / norm_scale;
  for (int i = 0; i < steps; ++i) {
    const NsCoefficients& triple = coefficients[NsCoefficientIndex(coefficients.size(), i, cycle)];
    const QuinticExtremes extremes = Extremes(triple, m);
    const std::string which = absl::StrCat("Newton-Schulz iteration ", i + 1, " of ", steps, " (",
                                           triple[0], ", ", triple[1], ", ", triple[2], ")");
    if (!(extremes.max_abs <= kMaxNsSingularValue)) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " can raise a singular value in [0, ", m, "] to ", extremes.max_abs,
                       "; accepted: schedules that keep them within [0, ", kMaxNsSingularValue,
                       "]"));
    }
    // A negative p(s) flips that singular direction, which the later iterations drive to -1: the
    // update points uphill. The first iteration is exempt: it sees the normalised input, whose
    // singular values lie near 1 only for a matrix dominated by one direction, and aol is fitted
    // for another input scaling (ns_schedule.h).
    if (i > 0 && extremes.min < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, " is ", extremes.min, " at s = ", extremes.argmin, ", inside the [0, ", m,
          "] the singular values can reach: it flips their sign, and the later iterations drive "
          "them to -1 (an update uphill); accepted: from the second iteration on, quintics that "
          "stay >= 0 there"));
    }
    const double next = extremes.max_abs;
    m = next;
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::optimizers
