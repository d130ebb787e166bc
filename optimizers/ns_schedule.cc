#include "optimizers/ns_schedule.h"

#include <cmath>
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
  if (schedule == "quintic" || schedule == "aol") {
    // Megatron-LM / emerging_optimizers name other tables so; rather than guess them, say so.
    return absl::InvalidArgumentError(absl::StrCat(
        "Newton-Schulz coefficients '", schedule,
        "': that table of Megatron-LM's emerging_optimizers is not implemented; expected simple "
        "(Keller Jordan's 3.4445, -4.7750, 2.0315, which Megatron calls simple), polar_express, or "
        "a,b,c[;a,b,c...]"));
  }
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Newton-Schulz coefficients '", schedule, "': ", why,
        "; expected simple, polar_express, or a,b,c[;a,b,c...] (one triple per iteration)"));
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
    }
    triples.push_back(triple);
  }
  return NsSchedule{std::move(triples), 1.0};
}

}  // namespace orthoshard::optimizers
