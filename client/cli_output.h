// What every megatrain command prints: its result on stdout, a failed RPC on stderr (with the
// exit code it maps to).
#pragma once

#include <string>

#include "grpcpp/support/status.h"

namespace megatrain::client {

// `text` on stdout, ending in a newline.
void Print(const std::string& text);
// Prints "megatrain: CODE: message" on stderr; returns ExitCodeForRpc(status).
int ExitFor(const grpc::Status& status);

}  // namespace megatrain::client
