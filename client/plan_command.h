// `megatrain plan` answered in-process (--offline, --scaling, or no daemon answering), and the
// drive-wear flags every plan is judged with.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "proto/megatrain.pb.h"

namespace megatrain::client {

// --nvme_rated_tbw and --nvme_wear_warn_share applied to `plan`; INVALID_ARGUMENT naming the flag
// for a negative TBW or a share without a TBW.
absl::Status ApplyWearFlags(const v1::JobSpec& spec, v1::PlanResponse& plan);
// The daemon's validation and the engine planner in-process; `why` is said in the output.
// Returns the exit code.
int PlanInProcess(const std::string& why);
// `plan --scaling` on the --hardware profile. Returns the exit code.
int PlanScaling();

}  // namespace megatrain::client
