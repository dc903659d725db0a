// Per-command deadlines and RPC exit codes (see command_deadline.h).
#include "client/command_deadline.h"

#include "client/exit_codes.h"
#include "proto/rpc_waits.h"

namespace megatrain::client {

absl::Duration CommandDeadline(const std::string& command, int timeout_seconds) {
  if (timeout_seconds > 0) return absl::Seconds(timeout_seconds);
  if (command == "checkpoint") return v1::kCheckpointRpcTimeout + absl::Seconds(30);
  if (command == "resume") return absl::Seconds(120);
  return absl::Seconds(30);
}

int ExitCodeForRpc(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::UNAVAILABLE:
      return kExitUnreachable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitDeadlineExceeded;
    default:
      return kExitRejected;
  }
}

}  // namespace megatrain::client
