// PlanOffline: the daemon's Plan RPC without a daemon (`megatrain plan --offline`): the same job
// spec validation and engine planner, run in-process under a daemon configuration.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"

namespace megatrain::service {

// Validates `spec` and plans it exactly as a megatraind configured by `daemon_config_path` (its
// textproto DaemonConfig: device, arena and pinned budget, roots, limits) would answer Plan.
// An empty path plans under the defaults of docs/daemon.md with "/" as the only data and output
// root (no daemon's roots to enforce). Errors are the daemon's, with the same codes.
absl::StatusOr<v1::PlanResponse> PlanOffline(const v1::JobSpec& spec,
                                             const std::string& daemon_config_path);

}  // namespace megatrain::service
