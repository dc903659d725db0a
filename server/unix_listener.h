// UnixListener: megatraind's Unix socket, accepted by hand so that each connection's kernel
// credentials (SO_PEERCRED) are recorded before the fd is handed to the gRPC server
// (grpc::AddInsecureChannelFromFd), see peer_identity.h. Replaces a stale socket file, sets the
// socket's mode before it listens.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "engine/common/unique_fd.h"
#include "grpcpp/server.h"
#include "server/peer_identity.h"

namespace megatrain::server {

class UnixListener {
 public:
  // Listens on `path` (mode `mode`) and hands every accepted connection to `server` (started,
  // outliving the listener) after recording its credentials in `peers`. FAILED_PRECONDITION
  // naming socket_path when the path holds something else than a socket or cannot be bound.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Start(const std::string& path, mode_t mode,
                                                             grpc::Server& server,
                                                             PeerRegistry& peers);
  ~UnixListener();  // Stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Stops accepting (call before the gRPC server shuts down); joins the thread.
  void Stop();

 private:
  UnixListener(engine::UniqueFd fd, grpc::Server& server, PeerRegistry& peers)
      : fd_(std::move(fd)), server_(server), peers_(peers) {}
  void Accept();

  engine::UniqueFd fd_;
  grpc::Server& server_;
  PeerRegistry& peers_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace megatrain::server
