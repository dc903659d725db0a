// JobStateName: the one display name of a job state ("QUEUED", ..., "UNSPECIFIED"), shared by
// the daemon's messages and logs and the CLI's tables.
#pragma once

#include <string>

#include "proto/megatrain.pb.h"

namespace megatrain::v1 {

// The enum value's name without a prefix; "UNSPECIFIED" for JOB_STATE_UNSPECIFIED.
std::string JobStateName(JobState state);

}  // namespace megatrain::v1
