// UnixListener (see unix_listener.h).
#include "server/unix_listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_posix.h"

namespace megatrain::server {

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Start(const std::string& path,
                                                                  mode_t mode, grpc::Server& server,
                                                                  PeerRegistry& peers) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket_path: '", path, "' does not fit a socket address"));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("socket_path: '", path, "' exists and is not a socket"));
    }
    unlink(path.c_str());  // stale socket of a previous run
  }
  engine::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket_path: socket: ", std::strerror(errno)));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket_path: cannot bind '", path, "': ", std::strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {  // before listen(): nobody connects with a wider mode
    return absl::FailedPreconditionError(absl::StrCat("socket_path: cannot chmod '", path, "'"));
  }
  if (listen(fd.get(), 128) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket_path: cannot listen on '", path, "': ", std::strerror(errno)));
  }
  std::unique_ptr<UnixListener> listener(new UnixListener(std::move(fd), server, peers));
  listener->thread_ = std::thread([l = listener.get()] { l->Accept(); });
  return listener;
}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Stop() {
  stopping_ = true;
  if (fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);  // wakes poll()
  if (thread_.joinable()) thread_.join();
}

void UnixListener::Accept() {
  while (!stopping_) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    if (stopping_) break;
    const int client = accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) continue;
    ucred credentials{};
    socklen_t length = sizeof(credentials);
    if (getsockopt(client, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
      close(client);  // a caller without credentials is never served
      continue;
    }
    // Recorded before gRPC sees the fd: the fd number is the call's identity (peer_identity.h).
    peers_.Record(client, PeerCredentials{credentials.pid, credentials.uid, credentials.gid});
    grpc::AddInsecureChannelFromFd(&server_, client);  // gRPC owns the fd from here
  }
}

}  // namespace megatrain::server
