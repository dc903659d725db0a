// The field checks every part of job-spec validation shares: an INVALID_ARGUMENT naming the
// field, and range checks whose messages give the value and the allowed interval.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace megatrain::service {

// INVALID_ARGUMENT "<field>: <problem>".
absl::Status Invalid(absl::string_view field, absl::string_view problem);

// `value` finite and within [lo, hi] (or (lo, hi] when lo_open).
absl::Status CheckFiniteRange(absl::string_view field, double value, double lo, double hi,
                              bool lo_open);

// `value` within [lo, hi].
absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi);

}  // namespace megatrain::service
