// `megatrain watch` (see watch_command.h).
#include "client/watch_command.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "client/cli_flags.h"
#include "client/cli_output.h"
#include "client/exit_codes.h"
#include "client/render.h"
#include "client/terminal_size.h"
#include "grpcpp/client_context.h"

namespace megatrain::client {

int Watch(v1::Trainer::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_id(id);
  std::unique_ptr<grpc::ClientReader<v1::ProgressEvent>> reader = stub.WatchJob(&context, request);
  const bool tty = isatty(fileno(stdout)) && !absl::GetFlag(FLAGS_json);
  v1::ProgressEvent event;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  while (reader->Read(&event)) {
    last = event.state();
    if (absl::GetFlag(FLAGS_json)) {
      Print(client::ToJson(event));
    } else if (event.has_eval_reply()) {
      // A reply to an eval prompt stays on screen: its own line, above the redrawn progress.
      if (tty) std::printf("\r\033[K");
      Print(event.message());
    } else if (tty) {
      std::printf("\r\033[K%s",
                  client::FitToWidth(client::ProgressLine(event, true), TerminalColumns()).c_str());
      std::fflush(stdout);
    } else {
      Print(client::ProgressLine(event, false));
    }
    // One event per line as it happens, also into a pipe or a file (tee, logs).
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");
  grpc::Status status = reader->Finish();
  if (!status.ok()) return ExitFor(status);
  return last == v1::SUCCEEDED ? kExitOk : kExitFailed;
}

}  // namespace megatrain::client
