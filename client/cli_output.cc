// What every megatrain command prints (see cli_output.h).
#include "client/cli_output.h"

#include <cstdio>

#include "absl/status/status.h"
#include "client/command_deadline.h"

namespace megatrain::client {

int ExitFor(const grpc::Status& status) {
  std::fprintf(stderr, "megatrain: %s: %s\n",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
               status.error_message().c_str());
  return client::ExitCodeForRpc(status);
}

void Print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
}

}  // namespace megatrain::client
