// `megatrain watch <id>` (and `submit --watch`): follows a job's events until it ends.
#pragma once

#include <string>

#include "proto/megatrain.grpc.pb.h"

namespace megatrain::client {

// A progress bar redrawn on a terminal, one line per event otherwise (JSON with --json); eval
// replies each on a line of their own. Returns the exit code: 0 when the job SUCCEEDED, 1 when it
// ended otherwise, the RPC's code when the stream failed.
int Watch(v1::Trainer::Stub& stub, const std::string& id);

}  // namespace megatrain::client
