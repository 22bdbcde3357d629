// Error handling inside the engine: absl::Status / absl::StatusOr everywhere. The C API maps
// them to kiln_status codes (lib/c_api/). Nothing inside the engine throws across a module
// boundary; code that can throw (std::bad_alloc) is caught at the C API.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/common/strings.h"

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not ok.
#define KILN_RETURN_IF_ERROR(expr)                \
  do {                                            \
    ::absl::Status kiln_status_ = (expr);         \
    if (!kiln_status_.ok()) return kiln_status_;  \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or return its error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_statusor_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
