// SdNotifier: systemd's notification protocol written by hand (no libsystemd): one datagram per
// state ("READY=1", "WATCHDOG=1", "STOPPING=1", "STATUS=...") to the socket $NOTIFY_SOCKET
// names, and the watchdog interval from $WATCHDOG_USEC (for Type=notify + WatchdogSec=).
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/common/unique_fd.h"

namespace megatrain::server {

class SdNotifier {
 public:
  // From the values of $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID (null or empty: unset)
  // and this process's pid. Without a socket the notifier is disabled and sends nothing; the
  // watchdog is on when WATCHDOG_USEC is set and WATCHDOG_PID is unset or `self`.
  // INVALID_ARGUMENT names the variable and its value when one is malformed.
  static absl::StatusOr<SdNotifier> Create(const char* notify_socket, const char* watchdog_usec,
                                           const char* watchdog_pid, pid_t self);
  SdNotifier(SdNotifier&&) = default;
  SdNotifier& operator=(SdNotifier&&) = default;

  bool enabled() const { return fd_.valid(); }
  absl::Duration watchdog_interval() const { return watchdog_; }  // zero = no watchdog
  // Sends `state` (e.g. "READY=1\nSTATUS=serving"); OK and nothing sent when disabled.
  absl::Status Notify(absl::string_view state) const;

 private:
  SdNotifier(engine::UniqueFd fd, std::string address, absl::Duration watchdog)
      : fd_(std::move(fd)), address_(std::move(address)), watchdog_(watchdog) {}

  engine::UniqueFd fd_;
  std::string address_;  // sun_path bytes; a leading NUL for the abstract namespace
  absl::Duration watchdog_;
};

}  // namespace megatrain::server
