// Propagation macros for absl::Status / absl::StatusOr<T>.
//
// Debian's abseil 20220623 predates abseil's own macros, so orthoshard defines the two it needs:
//
//   RETURN_IF_ERROR(expr);            // returns the status if `expr` is not OK
//   ASSIGN_OR_RETURN(lhs, expr);      // `lhs = *std::move(expr)`, or returns its status
//
// `lhs` may declare a variable (`ASSIGN_OR_RETURN(auto plan, MakePlan())`) or name an existing one.
// Both work in functions returning absl::Status or any absl::StatusOr<U>.
#ifndef ORTHOSHARD_COMMON_STATUS_MACROS_H_
#define ORTHOSHARD_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ORTHOSHARD_STATUS_CONCAT_INNER_(a, b) a##b
#define ORTHOSHARD_STATUS_CONCAT_(a, b) ORTHOSHARD_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                        \
  do {                                                               \
    ::absl::Status orthoshard_status_ = (expr);                      \
    if (!orthoshard_status_.ok()) return orthoshard_status_;         \
  } while (false)

#define ORTHOSHARD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                      \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = *std::move(statusor)

#define ASSIGN_OR_RETURN(lhs, expr)                                                        \
  ORTHOSHARD_ASSIGN_OR_RETURN_IMPL_(ORTHOSHARD_STATUS_CONCAT_(orthoshard_statusor_, __LINE__), \
                                    lhs, expr)

#endif  // ORTHOSHARD_COMMON_STATUS_MACROS_H_
