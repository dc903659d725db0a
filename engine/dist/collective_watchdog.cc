// The deadline on a rank's collective calls (see collective_watchdog.h).
#include "engine/dist/collective_watchdog.h"

#include <utility>

namespace megatrain::engine::dist {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::seconds timeout, OnOverdue on_overdue,
                                       Clock clock)
    : timeout_(timeout), on_overdue_(std::move(on_overdue)), clock_(std::move(clock)) {
  if (enabled()) thread_ = std::thread([this] { Watch(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::Begin(std::string collective) {
  if (!enabled()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_call_ = true;
    ++call_;
    started_ = clock_();
    collective_ = std::move(collective);
  }
  changed_.notify_all();
}

void CollectiveWatchdog::End() {
  if (!enabled()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_call_ = false;
  }
  changed_.notify_all();
}

void CollectiveWatchdog::NoteStep(uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
}

void CollectiveWatchdog::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (!in_call_) {
      changed_.wait(lock, [this] { return stopping_ || in_call_; });
      continue;
    }
    const uint64_t call = call_;
    auto call_over = [this, call] { return stopping_ || !in_call_ || call_ != call; };
    std::chrono::steady_clock::time_point deadline = started_ + timeout_;
    std::chrono::steady_clock::time_point last_wake = clock_();
    std::chrono::steady_clock::duration not_running{0};
    bool overdue = false;
    // Steady-clock waits: a wall-clock jump neither fires nor postpones the deadline.
    while (!changed_.wait_for(lock, kTick, call_over)) {
      const std::chrono::steady_clock::time_point now = clock_();
      if (now - last_wake > kTick + kStallSlack) {
        not_running += now - last_wake;
        deadline = now + timeout_;  // this process was not running: not the others' fault
      }
      last_wake = now;
      if (now >= deadline) {
        overdue = true;
        break;
      }
    }
    if (!overdue) continue;
    const Overdue report{collective_, step_, timeout_,
                         std::chrono::duration_cast<std::chrono::seconds>(not_running)};
    lock.unlock();
    on_overdue_(report);
    lock.lock();
    changed_.wait(lock, call_over);  // one report per call
  }
}

}  // namespace megatrain::engine::dist
