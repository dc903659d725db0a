// SdWatchdog (see sd_watchdog.h).
#include "server/sd_watchdog.h"

#include <string>

namespace megatrain::server {

SdWatchdog::SdWatchdog(const SdNotifier& notifier, StructuredLog& log, std::function<bool()> alive)
    : notifier_(notifier), log_(log), alive_(std::move(alive)) {
  if (notifier_.enabled() && notifier_.watchdog_interval() > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

SdWatchdog::~SdWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SdWatchdog::Loop() {
  const auto period = absl::ToChronoMilliseconds(notifier_.watchdog_interval() / 2);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [&] { return stop_; })) {
    lock.unlock();
    const bool alive = alive_();
    if (alive) {
      if (absl::Status s = notifier_.Notify("WATCHDOG=1"); !s.ok()) {
        log_.Event("watchdog_error", {{"error", s.ToString()}});
      }
    }
    lock.lock();
  }
}

}  // namespace megatrain::server
