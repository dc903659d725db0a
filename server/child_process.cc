// RunChildProcess (see child_process.h).
#include "server/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace megatrain::server {
namespace {

// The child's stdout [0] and stderr [1] pipes; every end still open is closed on the way out.
struct Pipes {
  int read[2] = {-1, -1};
  int write[2] = {-1, -1};
  ~Pipes() {
    for (int fd : {read[0], read[1], write[0], write[1]}) {
      if (fd >= 0) close(fd);
    }
  }
  void CloseWriteEnds() {
    for (int& fd : write) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
};

// posix_spawn attributes and file actions, destroyed on every path out.
struct SpawnSetup {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t actions;
  SpawnSetup() {
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_init(&actions);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

// Reads what is available on `fd` into `into`, keeping its first `limit` bytes (its last with
// `tail`); false at end of file (or an error other than EINTR/EAGAIN).
bool Drain(int fd, std::string& into, size_t limit, bool tail) {
  char buffer[4096];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  if (tail) {
    // Trimmed only past twice the limit (and once at the end): one move per `limit` bytes read.
    into.append(buffer, static_cast<size_t>(n));
    if (into.size() > 2 * limit) into.erase(0, into.size() - limit);
    return true;
  }
  const size_t room = into.size() < limit ? limit - into.size() : 0;
  into.append(buffer, std::min(room, static_cast<size_t>(n)));
  return true;
}

// Hands every complete line of `pending` to `on_line`, keeping the unfinished tail; with
// `flush` (end of stream) the tail goes too; a line of `limit` bytes or more goes in pieces
// of `limit`.
void DeliverLines(std::string& pending, size_t limit, bool flush,
                  const std::function<void(const std::string&)>& on_line) {
  size_t start = 0;
  for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', start)) {
    do {
      const size_t n = std::min(limit, nl - start);
      on_line(pending.substr(start, n));
      start += n;
    } while (start < nl);
    start = nl + 1;
  }
  pending.erase(0, start);
  while (pending.size() >= limit || (flush && !pending.empty())) {
    const size_t n = std::min(limit, pending.size());
    on_line(pending.substr(0, n));
    pending.erase(0, n);
  }
}

void KillAndReap(pid_t pid) {
  kill(-pid, SIGKILL);  // its group: anything it started goes too
  kill(pid, SIGKILL);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::string BesideThisExecutable(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return name;
  return (self.parent_path() / name).string();
}

std::vector<std::pair<int, int>> ChildFdNumbers(const std::vector<int>& fds) {
  int next = 3;
  for (int fd : fds) next = std::max(next, fd + 1);
  std::vector<std::pair<int, int>> out;
  for (int fd : fds) out.push_back({fd, next++});
  return out;
}

absl::StatusOr<ChildResult> RunChildProcess(const std::vector<std::string>& argv,
                                            const std::function<bool()>& should_stop,
                                            const ChildOptions& options) {
  if (argv.empty() || argv[0].empty()) {
    return absl::InvalidArgumentError("RunChildProcess: empty argv");
  }
  for (const auto& [from, to] : options.pass_fds) {
    for (const auto& [other, unused] : options.pass_fds) {
      if (to <= 2 || to <= other) {
        return absl::InvalidArgumentError(absl::StrCat("RunChildProcess: pass_fds: child fd ", to,
                                                       " is not above 2 and every source fd"));
      }
    }
  }
  Pipes pipes;
  for (int i = 0; i < 2; ++i) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    pipes.read[i] = fds[0];
    pipes.write[i] = fds[1];
  }
  SpawnSetup setup;
  // The daemon ignores SIGPIPE and handles SIGTERM/SIGINT; the child starts with defaults.
  sigset_t all;
  sigset_t none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&setup.attr, &all);
  posix_spawnattr_setsigmask(&setup.attr, &none);
  posix_spawnattr_setpgroup(&setup.attr, 0);
  posix_spawnattr_setflags(&setup.attr,
                           POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&setup.actions, pipes.write[0], 1);
  posix_spawn_file_actions_adddup2(&setup.actions, pipes.write[1], 2);
  // dup2 gives the child a copy without close-on-exec; the caller's own fd keeps it.
  for (const auto& [from, to] : options.pass_fds) {
    posix_spawn_file_actions_adddup2(&setup.actions, from, to);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (const int e =
          posix_spawn(&pid, argv[0].c_str(), &setup.actions, &setup.attr, args.data(), environ);
      e != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run '", argv[0], "': ", std::strerror(e)));
  }
  pipes.CloseWriteEnds();

  ChildResult result;
  std::string pending_line;  // stdout not yet a whole line (on_stdout_line only)
  const bool by_line = static_cast<bool>(options.on_stdout_line);
  std::string* sinks[2] = {by_line ? &pending_line : &result.out, &result.err};
  const int poll_ms =
      static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.poll_interval)));
  int status = 0;
  std::optional<absl::Time> kill_at;  // set once should_stop asked for the end
  // Once the child has exited, what is left in its pipes is read until this deadline: a process
  // it left behind holding them (a daemon of the launcher, an ssh master) must not keep the
  // caller waiting; its process group is then killed.
  std::optional<absl::Time> drain_until;
  while (true) {
    // Once the child is reaped its pid is no longer ours to signal, and its status is its result.
    const bool reaped = drain_until.has_value();
    if (!reaped && !kill_at.has_value() && should_stop()) {
      kill_at = absl::Now() + options.stop_grace;
      if (options.stop_grace > absl::ZeroDuration()) kill(pid, SIGTERM);
    }
    if (!reaped && kill_at.has_value() && absl::Now() >= *kill_at) {
      KillAndReap(pid);
      return absl::CancelledError(absl::StrCat("'", argv[0], "' stopped on request"));
    }
    if (!reaped && !kill_at.has_value() && options.signal_to_send) {
      if (const int sig = options.signal_to_send(); sig != 0) kill(pid, sig);
    }
    pollfd fds[2];
    nfds_t count = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (pipes.read[i] < 0) continue;
      fds[count] = pollfd{pipes.read[i], POLLIN, 0};
      which[count++] = i;
    }
    if (count == 0) {
      if (drain_until.has_value()) break;  // reaped below, its pipes now drained
      // Both streams closed: the child is exiting (or closed them and runs on; keep polling).
      const pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) break;
      if (done < 0 && errno != EINTR) {
        return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
      }
      poll(nullptr, 0, poll_ms);
      continue;
    }
    if (!drain_until.has_value()) {
      if (waitpid(pid, &status, WNOHANG) == pid) drain_until = absl::Now() + absl::Seconds(2);
    } else if (absl::Now() >= *drain_until) {
      kill(-pid, SIGKILL);  // what it left behind in its group holds the pipes
      break;
    }
    const int ready = poll(fds, count, poll_ms);
    if (ready < 0 && errno != EINTR) {
      KillAndReap(pid);
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    for (nfds_t k = 0; k < count && ready > 0; ++k) {
      if (fds[k].revents == 0) continue;
      const int i = which[k];
      // Lines are cut at the cap by DeliverLines, not dropped here.
      const bool open =
          Drain(pipes.read[i], *sinks[i], i == 0 && by_line ? SIZE_MAX : options.max_output_bytes,
                options.keep_tail);
      if (i == 0 && by_line) {
        DeliverLines(pending_line, options.max_output_bytes, !open, options.on_stdout_line);
      }
      if (!open) {
        close(pipes.read[i]);
        pipes.read[i] = -1;
      }
    }
  }
  if (options.keep_tail) {
    for (std::string* s : {&result.out, &result.err}) {
      if (s->size() > options.max_output_bytes) s->erase(0, s->size() - options.max_output_bytes);
    }
  }
  if (kill_at.has_value()) {
    // It exited within its grace after a stop: still a stop.
    return absl::CancelledError(absl::StrCat("'", argv[0], "' stopped on request"));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.term_signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace megatrain::server
