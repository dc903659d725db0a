// ResumableFailure: how an engine tells the job runner that a job failed in a way it can continue
// after from its last checkpoint.
#pragma once

#include "absl/status/status.h"

namespace megatrain::server {

// A failure the job can continue after from its last checkpoint (a rank of a job on several
// machines died or hung, so every rank ended): the runner pauses the job with the reason instead
// of failing it, and a resume relaunches it. The cause's code and message are kept.
absl::Status ResumableFailure(const absl::Status& cause);
bool IsResumableFailure(const absl::Status& status);

}  // namespace megatrain::server
