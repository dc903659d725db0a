// ValidateJobSpec: every field of a JobSpec checked at the edge (ranges, finiteness, sizes, paths
// under allowed roots, files present, a memory plan that fits), turned into what the engine runs.
#pragma once

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"
#include "service/daemon_config.h"
#include "service/path_policy.h"
#include "service/validated_job.h"

namespace megatrain::service {

// Errors carry the gRPC-meaningful code and name the field: INVALID_ARGUMENT (ranges, NaN,
// syntax), NOT_FOUND (missing files), PERMISSION_DENIED (outside roots, unreadable),
// RESOURCE_EXHAUSTED (over a daemon limit or budget), UNIMPLEMENTED (valid but unsupported
// features such as HF weights or token files).
absl::StatusOr<ValidatedJob> ValidateJobSpec(const v1::JobSpec& spec,
                                             const DaemonSettings& settings,
                                             const PathPolicy& paths);

}  // namespace megatrain::service
