// The deadline on a rank's collective calls (see collective_watchdog.h).
#include "engine/dist/collective_watchdog.h"

#include <utility>

namespace megatrain::engine::dist {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::seconds timeout, OnOverdue on_overdue)
    : timeout_(timeout), on_overdue_(std::move(on_overdue)) {
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
    started_ = std::chrono::steady_clock::now();
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
    // Waits on the steady clock: a wall-clock jump neither fires nor postpones the deadline.
    if (changed_.wait_until(lock, started_ + timeout_, call_over)) continue;
    const Overdue overdue{collective_, step_, timeout_};
    lock.unlock();
    on_overdue_(overdue);
    lock.lock();
    changed_.wait(lock, call_over);  // one report per call
  }
}

}  // namespace megatrain::engine::dist
