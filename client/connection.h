// Connection: a channel to megatraind over its Unix socket, or over TCP with TLS and a bearer
// token read from a file.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace megatrain::client {

struct ConnectionOptions {
  std::string socket_path;  // used when address is empty
  std::string address;      // host:port of a TCP listener
  std::string token_file;   // required with address
  std::string ca_file;      // PEM roots that sign the daemon's certificate; empty = system roots
};

// INVALID_ARGUMENT for an incomplete TCP setup, NOT_FOUND for unreadable files.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const ConnectionOptions& options);

}  // namespace megatrain::client
