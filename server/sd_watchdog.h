// SdWatchdog: the thread that keeps systemd's watchdog (WatchdogSec=) fed: every half interval
// it asks a liveness probe (megatraind: the job runner answers its status, so its lock is not
// stuck) and only then sends "WATCHDOG=1". A daemon whose probe stops answering is killed and
// restarted by systemd.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "server/sd_notify.h"
#include "server/structured_log.h"

namespace megatrain::server {

class SdWatchdog {
 public:
  // Starts the thread when `notifier` has a watchdog interval; otherwise does nothing.
  // `notifier`, `log` and what `alive` uses outlive the watchdog.
  SdWatchdog(const SdNotifier& notifier, StructuredLog& log, std::function<bool()> alive);
  ~SdWatchdog();  // stops and joins the thread
  SdWatchdog(const SdWatchdog&) = delete;
  SdWatchdog& operator=(const SdWatchdog&) = delete;

 private:
  void Loop();

  const SdNotifier& notifier_;
  StructuredLog& log_;
  const std::function<bool()> alive_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace megatrain::server
