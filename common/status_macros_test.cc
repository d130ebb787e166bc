#include "common/status_macros.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard {
namespace {

using ::orthoshard::testing::IsOk;
using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd input " + std::to_string(x));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(half, Half(half));
  return half;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int x) {
  if (x < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(x);
}

absl::StatusOr<int> Unbox(int x) {
  ASSIGN_OR_RETURN(auto box, MakeBox(x));  // move-only value
  return *box;
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesValueAndError) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd input 3")));
  EXPECT_THAT(Quarter(5), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd input 5")));
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtFirstError) {
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(3), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd")));
}

TEST(StatusMacrosTest, WorksWithMoveOnlyValues) {
  EXPECT_EQ(*Unbox(7), 7);
  EXPECT_THAT(Unbox(-1), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("negative")));
}

TEST(DTypeTest, NamesSizesAndParsingRoundTrip) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64,
                  DType::kInt64, DType::kInt32, DType::kUInt8}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(*ParseDType("BFloat16"), DType::kBFloat16);
  EXPECT_THAT(ParseDType("fp8"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown dtype 'fp8'")));
}

}  // namespace
}  // namespace orthoshard
