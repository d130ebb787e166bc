#include "integration/step_schedule.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::integration {

absl::Status SequentialSchedule::Run(int micro_batches, MicroBatchPasses& passes) const {
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step schedule '", name(), "': ", micro_batches, " micro-batches, expected at least 1"));
  }
  for (int m = 0; m < micro_batches; ++m) {
    RETURN_IF_ERROR(passes.Forward(m));
    RETURN_IF_ERROR(passes.Backward(m, /*syncs_grads=*/m + 1 == micro_batches));
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::integration
