// MetricsHttpServer: serves a prometheus-cpp registry as text on GET /metrics from one loopback
// listener thread. (prometheus::Exposer's civetweb threads use a fixed 100 KiB stack, smaller
// than the static TLS of the CUDA and OpenBLAS libraries linked into megatraind, so their
// creation fails with EINVAL; this server uses default-sized threads.)
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace megatrain::server {

class MetricsHttpServer {
 public:
  // `address` is "127.0.0.1:<port>", "localhost:<port>" or "[::1]:<port>"; port 0 = any free one.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int fd, int port, std::shared_ptr<prometheus::Registry> registry)
      : fd_(fd), port_(port), registry_(std::move(registry)) {}
  void Serve();
  void Answer(int client);

  const int fd_;
  const int port_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace megatrain::server
