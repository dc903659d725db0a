// `megatrain plan --nvme_rated_tbw`: judges a plan's NVMe writes against the drive's rated TBW
// given on the command line (instead of the daemon's nvme_rated_tbw_bytes).
#pragma once

#include "absl/status/status.h"
#include "engine/planner/drive_wear.h"
#include "proto/megatrain.pb.h"

namespace megatrain::client {

// Replaces the plan's drive-wear warning with the judgement under `limit` (the run's
// hyper.steps x the plan's bytes written per step). INVALID_ARGUMENT naming
// --nvme_wear_warn_share when the share is not in (0, 1].
absl::Status ApplyDriveWearLimit(const v1::JobSpec& spec,
                                 const engine::planner::DriveWearLimit& limit,
                                 v1::PlanResponse& plan);

}  // namespace megatrain::client
