// Shared field checks of job-spec validation (see spec_field_checks.h).
#include "service/spec_field_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace megatrain::service {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status CheckFiniteRange(absl::string_view field, double value, double lo, double hi,
                              bool lo_open) {
  if (!std::isfinite(value)) return Invalid(field, absl::StrCat(value, " is not finite"));
  if ((lo_open ? value <= lo : value < lo) || value > hi) {
    return Invalid(field,
                   absl::StrCat(value, " is outside ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return Invalid(field, absl::StrCat(value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::service
