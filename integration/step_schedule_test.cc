#include "integration/step_schedule.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records the passes a schedule runs, as "F0", "B0", "B2+sync"; fails the pass named `fail_at`.
class RecordingPasses final : public MicroBatchPasses {
 public:
  explicit RecordingPasses(std::string fail_at = "") : fail_at_(std::move(fail_at)) {}
  absl::Status Forward(int m) override { return Record(absl::StrCat("F", m)); }
  absl::Status Backward(int m, bool syncs_grads) override {
    return Record(absl::StrCat("B", m, syncs_grads ? "+sync" : ""));
  }
  const std::vector<std::string>& events() const { return events_; }

 private:
  absl::Status Record(std::string event) {
    if (event == fail_at_) return absl::UnavailableError(absl::StrCat(event, " failed"));
    events_.push_back(std::move(event));
    return absl::OkStatus();
  }
  std::string fail_at_;
  std::vector<std::string> events_;
};

// The contract of step_schedule.h for any schedule over M micro-batches: every forward once, every
// backward once and after its forward, the grad-sync flag on the last backward run and no other.
void ExpectValidOrder(const std::vector<std::string>& events, int m) {
  std::vector<int> forwards(m, 0), backwards(m, 0);
  int syncs = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string& e = events[i];
    const bool sync = e.size() > 5 && e.substr(e.size() - 5) == "+sync";
    const int index = std::stoi(e.substr(1, e.size() - 1 - (sync ? 5 : 0)));
    ASSERT_TRUE(index >= 0 && index < m) << e;
    if (e[0] == 'F') {
      ++forwards[index];
    } else {
      EXPECT_EQ(forwards[index], 1) << e << ": backward before its forward";
      ++backwards[index];
      if (sync) {
        ++syncs;
        for (size_t j = i + 1; j < events.size(); ++j) {
          EXPECT_NE(events[j][0], 'B') << "a backward after the grad-syncing " << e;
        }
      }
    }
  }
  for (int i = 0; i < m; ++i) {
    EXPECT_EQ(forwards[i], 1) << "micro-batch " << i;
    EXPECT_EQ(backwards[i], 1) << "micro-batch " << i;
  }
  EXPECT_EQ(syncs, 1);
}

TEST(SequentialSchedule, RunsEachMicroBatchForwardThenBackwardInOrder) {
  const SequentialSchedule schedule;
  RecordingPasses passes;
  ASSERT_OK(schedule.Run(3, passes));
  EXPECT_THAT(passes.events(), ElementsAre("F0", "B0", "F1", "B1", "F2", "B2+sync"));
  for (int m : {1, 2, 7}) {
    RecordingPasses more;
    ASSERT_OK(schedule.Run(m, more));
    ExpectValidOrder(more.events(), m);
  }
}

TEST(SequentialSchedule, OneMicroBatchSyncsInItsOnlyBackward) {
  RecordingPasses passes;
  ASSERT_OK(SequentialSchedule().Run(1, passes));
  EXPECT_THAT(passes.events(), ElementsAre("F0", "B0+sync"));
}

// The first failing pass ends the step: nothing after it runs, its status comes back unchanged
// (it names the rank and collective when a hook failed).
TEST(SequentialSchedule, StopsAtTheFirstFailingPass) {
  RecordingPasses passes("B1");
  EXPECT_THAT(SequentialSchedule().Run(3, passes),
              StatusIs(absl::StatusCode::kUnavailable, "B1 failed"));
  EXPECT_THAT(passes.events(), ElementsAre("F0", "B0", "F1"));
}

TEST(SequentialSchedule, RefusesNoMicroBatches) {
  RecordingPasses passes;
  EXPECT_THAT(SequentialSchedule().Run(0, passes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("step schedule 'sequential': 0 micro-batches, expected at least 1")));
  EXPECT_TRUE(passes.events().empty());
}

}  // namespace
}  // namespace orthoshard::integration
