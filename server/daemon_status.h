// BuildDaemonStatus: the daemon's health, queue, device and memory tiers against their budgets,
// as GetDaemonStatus answers it and the dashboard shows it (one builder for both).
#pragma once

#include <string>

#include "proto/megatrain.pb.h"
#include "server/job_runner.h"
#include "service/daemon_config.h"

namespace megatrain::server {

inline constexpr char kDaemonVersion[] = "megatraind 0.1.0";

// Reads the runner's status, each device (arena and health) and the running job's memory
// (device and pinned tiers).
v1::DaemonStatus BuildDaemonStatus(const service::DaemonSettings& settings, const JobRunner& runner,
                                   const std::string& public_key_hex);

}  // namespace megatrain::server
