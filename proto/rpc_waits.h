// How long the daemon's handlers may wait before answering, so clients set deadlines beyond them.
#pragma once

#include "absl/time/time.h"

namespace megatrain::v1 {

// A Checkpoint RPC waits this long for the running job to commit the checkpoint it asked for.
inline constexpr absl::Duration kCheckpointRpcTimeout = absl::Seconds(120);

}  // namespace megatrain::v1
