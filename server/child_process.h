// RunChildProcess: runs a helper binary (no shell) with its output captured, killed when the
// caller asks it to stop; the runner thread uses it for work that must not share the daemon's
// process (megatrain_tokenize).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace megatrain::server {

struct ChildResult {
  int exit_code = -1;   // -1 when killed by a signal
  int term_signal = 0;  // the signal that ended it, 0 when it exited
  std::string out;      // stdout, its first max_output_bytes (its last with keep_tail)
  std::string err;      // stderr, its first max_output_bytes (its last with keep_tail)
};

struct ChildOptions {
  absl::Duration poll_interval = absl::Milliseconds(50);  // how often should_stop is asked
  size_t max_output_bytes = 64 << 10;                     // per stream; the rest is drained
  // Descriptors handed to the child: {the caller's fd, its number in the child}. The daemon
  // passes the inputs it checked, so the child reads those and not the paths again. Every child
  // number must be above 2 and above every caller fd listed (no dup2 may overwrite a later
  // source); INVALID_ARGUMENT otherwise.
  std::vector<std::pair<int, int>> pass_fds;
  // Each complete line of stdout as it comes (without its '\n'; a line longer than
  // max_output_bytes comes in pieces of that size), instead of keeping stdout in
  // ChildResult::out.
  std::function<void(const std::string& line)> on_stdout_line;
  // Keep the last max_output_bytes of a stream instead of the first (a launcher's last words,
  // after hours of its ranks' output, say why it ended).
  bool keep_tail = false;
  // Polled with should_stop: a signal to send the child itself (not its group) now, 0 = none.
  // How a supervisor asks a launcher (mpirun forwards SIGUSR1/SIGUSR2 to its ranks) for more
  // than a kill.
  std::function<int()> signal_to_send;
  // How should_stop ends the child: SIGTERM to the child, then up to this long for it to exit
  // (its output still read) before SIGKILL to its group; zero = SIGKILL at once.
  absl::Duration stop_grace = absl::ZeroDuration();
};

// `name` in the running executable's directory (where megatraind's helpers are installed);
// `name` alone when /proc/self/exe cannot be read.
std::string BesideThisExecutable(const std::string& name);

// The child numbers for `fds` under ChildOptions::pass_fds' rule: above 2 and above all of them.
std::vector<std::pair<int, int>> ChildFdNumbers(const std::vector<int>& fds);

// Spawns argv[0] (an absolute or relative path; PATH is not searched) with argv, stdin from
// /dev/null, in its own process group, default signal dispositions and an empty signal mask.
// Waits for it while polling `should_stop`: once that is true the child's group gets SIGKILL
// (after ChildOptions::stop_grace), the child is reaped and CANCELLED is returned.
// FAILED_PRECONDITION when it cannot be spawned (naming the path). Otherwise the child's exit,
// whatever its code.
absl::StatusOr<ChildResult> RunChildProcess(const std::vector<std::string>& argv,
                                            const std::function<bool()>& should_stop,
                                            const ChildOptions& options = {});

}  // namespace megatrain::server
