// The JobSpec that `megatrain submit` and `plan` send: the --spec file with the command line's
// overrides applied on top (cli_flags.h).
#pragma once

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"

namespace megatrain::client {

// The --spec file (when given) with every set flag applied; an unreadable or bad file is the
// error, naming it.
absl::StatusOr<v1::JobSpec> SpecFromFlags();

}  // namespace megatrain::client
