// PlanOffline: the daemon's Plan RPC without a daemon (`megatrain plan --offline`): the same job
// spec validation and engine planner, run in-process under a daemon configuration. And
// PlanScalingOffline: the same job on a named hardware profile, with its data-parallel scaling
// (`megatrain plan --scaling`).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/planner/data_parallel.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/planner.h"
#include "proto/megatrain.pb.h"

namespace megatrain::service {

// Validates `spec` and plans it exactly as a megatraind configured by `daemon_config_path` (its
// textproto DaemonConfig: device, arena and pinned budget, roots, limits) would answer Plan.
// An empty path plans under the defaults of docs/daemon.md with "/" as the only data and output
// root (no daemon's roots to enforce). Errors are the daemon's, with the same codes.
absl::StatusOr<v1::PlanResponse> PlanOffline(const v1::JobSpec& spec,
                                             const std::string& daemon_config_path);

struct OfflineScaling {
  engine::planner::HardwareProfile hardware;
  engine::planner::PlanResult plan;  // one device
  std::vector<engine::planner::DataParallelPrediction> rows;
};

// The spec validated as PlanOffline does (but for `devices`: the prediction is for hardware the
// daemon need not have), planned on the built-in hardware profile `hardware` (its device memory;
// the spec's memory budgets when it gives ram_bytes or nvme_dir, else everything in RAM), and
// predicted at 1, 2, 4, 8 devices in a node, 2 and 4 nodes of 8, and the spec's devices.
// NOT_FOUND naming the known profiles for an unknown one.
absl::StatusOr<OfflineScaling> PlanScalingOffline(const v1::JobSpec& spec,
                                                  const std::string& daemon_config_path,
                                                  const std::string& hardware);

}  // namespace megatrain::service
