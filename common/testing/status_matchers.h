// GoogleMock matchers for absl::Status and absl::StatusOr<T> (Debian's abseil has none).
//
//   EXPECT_THAT(DoIt(), IsOk());
//   EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
//   ASSERT_OK_AND_ASSIGN(auto plan, MakePlan());
#ifndef ORTHOSHARD_COMMON_TESTING_STATUS_MATCHERS_H_
#define ORTHOSHARD_COMMON_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = ::orthoshard::testing::GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher, negation)) {
  const absl::Status& status = ::orthoshard::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::Matches(::testing::Matcher<std::string>(message_matcher))(
             std::string(status.message()));
}

}  // namespace orthoshard::testing

#define ORTHOSHARD_MATCHERS_CONCAT_INNER_(a, b) a##b
#define ORTHOSHARD_MATCHERS_CONCAT_(a, b) ORTHOSHARD_MATCHERS_CONCAT_INNER_(a, b)
#define ORTHOSHARD_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                        \
  ASSERT_TRUE(statusor.ok()) << statusor.status();               \
  lhs = *std::move(statusor)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ORTHOSHARD_ASSERT_OK_AND_ASSIGN_IMPL_(ORTHOSHARD_MATCHERS_CONCAT_(assert_statusor_, __LINE__), lhs, expr)
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::orthoshard::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::orthoshard::testing::IsOk())

#endif  // ORTHOSHARD_COMMON_TESTING_STATUS_MATCHERS_H_
