// CollectiveWatchdog: a deadline on every collective call of one rank. A collective blocks until
// every rank has joined it, so a rank that is stopped (SIGSTOP), hung or deadlocked leaves the
// others waiting forever; the launcher only notices ranks that exit. The watchdog's thread
// reports a call that has not completed within the timeout once, to a callback that ends the job
// (MpiCommunicator: a message naming this rank, its host, the collective and the step, then
// MPI_Abort). docs/scale_out.md, "Failures".
//
// Only time this process runs counts: the thread wakes every kTick, and a wake-up that comes more
// than kTick + kStallSlack after the last one means the process itself was not running (stopped
// with SIGSTOP, a suspended job, starved); the other ranks are not to blame for that, so the call
// gets a whole new deadline from then. A job suspended and continued as a whole (every rank
// stopped) therefore goes on, and a stopped rank that is continued does not report the ranks that
// waited for it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace megatrain::engine::dist {

class CollectiveWatchdog {
 public:
  // What the callback learns of an overdue call.
  struct Overdue {
    std::string collective;        // the name Begin was given
    std::optional<uint64_t> step;  // the last NoteStep, if any
    std::chrono::seconds timeout;
    // Time during the call when this process was noticed not running (not counted).
    std::chrono::seconds not_running{0};
  };
  using OnOverdue = std::function<void(const Overdue&)>;
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr std::chrono::seconds kTick{1};
  static constexpr std::chrono::seconds kStallSlack{4};

  // timeout <= 0 turns the watchdog off (no thread; Begin and End do nothing). `on_overdue` runs
  // on the watchdog's thread, at most once per Begin; it may end the process. `clock` is the
  // steady clock; tests pass one that jumps, as it does for a process that was stopped.
  CollectiveWatchdog(std::chrono::seconds timeout, OnOverdue on_overdue,
                     Clock clock = std::chrono::steady_clock::now);
  ~CollectiveWatchdog();  // stops and joins the thread (without reporting the call in flight)
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  bool enabled() const { return timeout_.count() > 0; }
  // A collective call starts; its deadline is now + timeout. Calls do not nest.
  void Begin(std::string collective);
  // The call started by the last Begin completed (or failed: it returned).
  void End();
  // The optimizer step the following collectives belong to, for the report.
  void NoteStep(uint64_t step);

 private:
  void Watch();

  const std::chrono::seconds timeout_;
  const OnOverdue on_overdue_;
  const Clock clock_;
  std::mutex mu_;
  std::condition_variable changed_;                // a call began or ended, or the watchdog stops
  bool stopping_ = false;                          // guarded by mu_
  bool in_call_ = false;                           // guarded by mu_
  uint64_t call_ = 0;                              // guarded by mu_: counts Begin calls
  std::chrono::steady_clock::time_point started_;  // guarded by mu_
  std::string collective_;                         // guarded by mu_
  std::optional<uint64_t> step_;                   // guarded by mu_
  std::thread thread_;                             // last: started once the members above exist
};

// RAII: Begin on construction, End on destruction.
class WatchedCollective {
 public:
  WatchedCollective(CollectiveWatchdog& watchdog, std::string collective) : watchdog_(watchdog) {
    watchdog_.Begin(std::move(collective));
  }
  ~WatchedCollective() { watchdog_.End(); }
  WatchedCollective(const WatchedCollective&) = delete;
  WatchedCollective& operator=(const WatchedCollective&) = delete;

 private:
  CollectiveWatchdog& watchdog_;
};

}  // namespace megatrain::engine::dist
