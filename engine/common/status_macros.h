// MT_RETURN_IF_ERROR: returns the status of `expr` from the enclosing function when it is not OK.
#pragma once

#include "absl/status/status.h"

#define MT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    const absl::Status mt_status_ = (expr);  \
    if (!mt_status_.ok()) return mt_status_; \
  } while (false)
