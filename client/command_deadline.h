// Per-command RPC deadlines of the CLI and the exit code of a failed RPC.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace megatrain::client {

// The deadline of `command`'s unary call: `timeout_seconds` when > 0 (the --timeout_seconds
// flag), else the command's own: checkpoint outlasts the daemon's checkpoint wait
// (v1::kCheckpointRpcTimeout) by 30 s; resume gets 120 s (its handler re-hashes the job's
// data, about 0.7 s per GB); every other command 30 s.
absl::Duration CommandDeadline(const std::string& command, int timeout_seconds);

// kExitUnreachable for UNAVAILABLE, kExitDeadlineExceeded for DEADLINE_EXCEEDED, else
// kExitRejected (client/exit_codes.h).
int ExitCodeForRpc(const grpc::Status& status);

}  // namespace megatrain::client
