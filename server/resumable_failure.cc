// ResumableFailure (see resumable_failure.h): a payload on the cause's status.
#include "server/resumable_failure.h"

#include "absl/strings/cord.h"

namespace megatrain::server {
namespace {
constexpr char kResumablePayload[] = "type.megatrain/resumable";
}  // namespace

absl::Status ResumableFailure(const absl::Status& cause) {
  absl::Status status = cause;
  status.SetPayload(kResumablePayload, absl::Cord("1"));
  return status;
}

bool IsResumableFailure(const absl::Status& status) {
  return status.GetPayload(kResumablePayload).has_value();
}

}  // namespace megatrain::server
