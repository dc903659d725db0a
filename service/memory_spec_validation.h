// Job-spec validation of `memory`: the budgets against the daemon's limits and the machine's RAM,
// the NVMe tier's directory, and the engine planner's exact placement and device plan (refused
// with the field of the budget that lacks room); fills job.plan.
#pragma once

#include "absl/status/status.h"
#include "engine/planner/planner.h"
#include "proto/megatrain.pb.h"
#include "service/daemon_config.h"
#include "service/path_policy.h"
#include "service/validated_job.h"

namespace megatrain::service {

// The planner's inputs of a validated job (batch, executor options, budgets, drive wear), as the
// daemon plans it; the device's arena is the daemon's.
engine::planner::PlanInputs PlanInputsFor(const ValidatedJob& job, const DaemonSettings& settings);

// Needs job.model and the trainer/executor options validated before it.
absl::Status ValidateMemory(const v1::MemoryBudgets& m, const DaemonSettings& settings,
                            const PathPolicy& paths, ValidatedJob& job);

}  // namespace megatrain::service
