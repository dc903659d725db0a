// `megatrain top`: every job and the daemon at a glance, redrawn: the screen as a pure function
// of what the daemon reports (tested), and the loop that polls it.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/megatrain.grpc.pb.h"

namespace megatrain::client {

// The whole screen: the daemon's line (version, device, health, queue, memory per tier against
// its budget), then one row per job — running, paused and queued first, then the rest newest
// first — with a progress bar, loss, validation loss, tokens/s and ETA; at most `rows` lines
// (rows <= 0: no limit), each cut to `columns` (<= 0: no limit). `error` (a failed poll) replaces
// everything below the clock line with the reason.
std::string TopScreen(const v1::DaemonStatus& status, const std::vector<v1::Job>& jobs,
                      absl::Time now, int columns, int rows, const std::string& error = "");

struct TopOptions {
  absl::Duration interval = absl::Seconds(2);
  int iterations = 0;  // screens to draw; 0 = until interrupted
  bool redraw = true;  // clear the terminal before each screen (a tty); false = one after another
  int columns = 0;
  int rows = 0;
  absl::Duration rpc_deadline = absl::Seconds(10);
};

// Polls the daemon (GetDaemonStatus, every page of ListJobs) and draws TopScreen to stdout.
// Returns the exit code: 0, or 3 (unreachable) when the last poll failed.
int RunTop(v1::Trainer::Stub& stub, const TopOptions& options);

}  // namespace megatrain::client
