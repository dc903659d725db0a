// `megatrain plan --scaling`: the job on a hardware profile, and its predicted data-parallel
// scaling (tokens/s, TFLOP/s, efficiency and bottleneck at 1, 2, 4, 8 devices and over nodes).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"

namespace megatrain::client {

// Plans `spec` in-process (service::PlanScalingOffline under `daemon_config_path`) on the
// built-in profile `hardware` and renders it: the one-device step, then the scaling table (or
// JSON with "hardware", "one_device" and "data_parallel").
absl::StatusOr<std::string> PlanScalingText(const v1::JobSpec& spec,
                                            const std::string& daemon_config_path,
                                            const std::string& hardware, bool json);

}  // namespace megatrain::client
