// SdNotifier (see sd_notify.h).
#include "server/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace megatrain::server {

absl::StatusOr<SdNotifier> SdNotifier::Create(const char* notify_socket, const char* watchdog_usec,
                                              const char* watchdog_pid, pid_t self) {
  absl::Duration watchdog = absl::ZeroDuration();
  if (watchdog_usec != nullptr && *watchdog_usec != '\0') {
    uint64_t usec = 0;
    if (!absl::SimpleAtoi(watchdog_usec, &usec) || usec == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("WATCHDOG_USEC: '", watchdog_usec, "' is not a positive integer"));
    }
    int64_t pid = 0;
    if (watchdog_pid != nullptr && *watchdog_pid != '\0' && !absl::SimpleAtoi(watchdog_pid, &pid)) {
      return absl::InvalidArgumentError(
          absl::StrCat("WATCHDOG_PID: '", watchdog_pid, "' is not a pid"));
    }
    if (pid == 0 || pid == self) watchdog = absl::Microseconds(static_cast<int64_t>(usec));
  }
  if (notify_socket == nullptr || *notify_socket == '\0') {
    return SdNotifier(engine::UniqueFd(), "", absl::ZeroDuration());
  }
  std::string address = notify_socket;
  if (address[0] != '/' && address[0] != '@') {
    return absl::InvalidArgumentError(absl::StrCat(
        "NOTIFY_SOCKET: '", address, "' is neither an absolute path nor an abstract '@' name"));
  }
  if (address.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NOTIFY_SOCKET: '", address, "' is longer than a socket address"));
  }
  if (address[0] == '@') address[0] = '\0';
  engine::UniqueFd fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("NOTIFY_SOCKET: socket: ", std::strerror(errno)));
  }
  return SdNotifier(std::move(fd), std::move(address), watchdog);
}

absl::Status SdNotifier::Notify(absl::string_view state) const {
  if (!enabled()) return absl::OkStatus();
  sockaddr_un to{};
  to.sun_family = AF_UNIX;
  std::memcpy(to.sun_path, address_.data(), address_.size());
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size());
  const ssize_t sent = sendto(fd_.get(), state.data(), state.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&to), length);
  if (sent != static_cast<ssize_t>(state.size())) {
    return absl::UnavailableError(
        absl::StrCat("sd_notify '", state, "': ", sent < 0 ? std::strerror(errno) : "short send"));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::server
