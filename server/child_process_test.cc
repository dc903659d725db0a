// RunChildProcess: exit codes and both streams captured, a missing binary named, and a child
// that would run for minutes killed (and reaped) as soon as the caller asks it to stop.
#include "server/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

TEST(ChildProcessTest, CapturesExitCodeAndBothStreams) {
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c", "echo out; echo err >&2; cat; exit 3"}, [] { return false; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->term_signal, 0);
  EXPECT_EQ(r->out, "out\n");  // stdin is /dev/null: cat ends at once
  EXPECT_EQ(r->err, "err\n");
}

// A child that exits leaving a process behind that holds its output pipes (a launcher's daemon,
// an ssh master): the child's result comes back, what it wrote is kept, and what it left in its
// process group is killed, instead of the caller waiting for the pipes to close.
TEST(ChildProcessTest, AChildsLeftoverHoldingItsPipesDoesNotKeepTheCallerWaiting) {
  const std::string pid_file = std::string(std::getenv("TEST_TMPDIR")) + "/leftover.pid";
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c", "sleep 600 & echo $! > " + pid_file + "; echo done; exit 3"},
      [] { return false; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->out, "done\n");
  std::ifstream in(pid_file);
  pid_t leftover = 0;
  ASSERT_TRUE(in >> leftover);
  // Killed (SIGKILL to the group); it was the shell's child, reaped by init: gone or a zombie.
  for (int i = 0; i < 1000 && kill(leftover, 0) == 0; ++i) {
    std::ifstream stat("/proc/" + std::to_string(leftover) + "/stat");
    std::string pid, comm, state;
    if (!(stat >> pid >> comm >> state) || state == "Z") break;
    usleep(10000);
  }
  std::ifstream stat("/proc/" + std::to_string(leftover) + "/stat");
  std::string pid, comm, state;
  EXPECT_TRUE(!(stat >> pid >> comm >> state) || state == "Z") << "the leftover still runs";
}

TEST(ChildProcessTest, OutputBeyondTheCapIsDrainedNotKept) {
  ChildOptions options;
  options.max_output_bytes = 1001;
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c", "head -c 300007 /dev/zero"}, [] { return false; }, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->out.size(), 1001u);
}

TEST(ChildProcessTest, KeepsTheTailWhenAsked) {
  ChildOptions options;
  options.max_output_bytes = 5;
  options.keep_tail = true;
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c", "head -c 300000 /dev/zero >&2; printf 'last\\n' >&2"},
      [] { return false; }, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->err, "last\n");
}

TEST(ChildProcessTest, MissingBinaryIsNamed) {
  absl::StatusOr<ChildResult> r = RunChildProcess({"/no/such/tool", "x"}, [] { return false; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("/no/such/tool"));
}

TEST(ChildProcessTest, KilledAndReapedWhenAskedToStop) {
  // The child reports its pid through a FIFO, then becomes a 10-minute sleep.
  const std::string fifo = std::string(std::getenv("TEST_TMPDIR")) + "/pid.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  std::string pid_text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool timed_out = false;
  auto should_stop = [&] {
    char buffer[32];
    const ssize_t n = read(reader, buffer, sizeof(buffer));
    if (n > 0) pid_text.append(buffer, static_cast<size_t>(n));
    if (std::chrono::steady_clock::now() > deadline) timed_out = true;
    return pid_text.find('\n') != std::string::npos || timed_out;
  };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c", "echo $$ > " + fifo + "; exec sleep 600"}, should_stop);
  close(reader);
  ASSERT_FALSE(timed_out) << "the child never reported its pid";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  const pid_t pid = static_cast<pid_t>(std::atol(pid_text.c_str()));
  ASSERT_GT(pid, 0);
  EXPECT_EQ(kill(pid, 0), -1) << "the child " << pid << " still exists";
  EXPECT_EQ(errno, ESRCH);
}

TEST(ChildProcessTest, StdoutLinesAsTheyCome) {
  ChildOptions options;
  options.max_output_bytes = 8;
  std::vector<std::string> lines;
  options.on_stdout_line = [&](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c", "printf 'a\\nbb\\n\\n0123456789abc\\nlast'"}, [] { return false; },
      options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "");
  // A line past the cap is cut there; its rest is a line of its own; an unfinished last line
  // comes at the end of the stream.
  EXPECT_THAT(lines, ::testing::ElementsAre("a", "bb", "", "01234567", "89abc", "last"));
}

TEST(ChildProcessTest, SignalsTheChildAndGivesAStopItsGrace) {
  // The child answers SIGUSR1 on stdout and exits cleanly on SIGTERM; the caller signals once
  // the child said it is ready, and stops once the answer came.
  ChildOptions options;
  options.stop_grace = absl::Seconds(60);  // a bound: the child exits as soon as it is told
  bool ready = false, answered = false, signalled = false;
  options.on_stdout_line = [&](const std::string& line) {
    ready = ready || line == "ready";
    answered = answered || line == "usr1";
  };
  options.signal_to_send = [&] {
    if (!ready || signalled) return 0;
    signalled = true;
    return SIGUSR1;
  };
  absl::StatusOr<ChildResult> r = RunChildProcess(
      {"/bin/sh", "-c",
       "trap 'echo usr1' USR1; trap 'echo term; exit 0' TERM; echo ready; "
       "while :; do sleep 0.05; done"},
      [&] { return answered; }, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(signalled);
  EXPECT_TRUE(answered);
}

}  // namespace
}  // namespace megatrain::server
