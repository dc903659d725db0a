// MetricsHttpServer: serves a prometheus-cpp registry as text on GET /metrics on a loopback
// port, and any other GET path through an optional handler (the dashboard): one accepting thread, a
// few serving threads, a cap on open connections, and per connection a deadline for the whole
// request and a send timeout, so slow or stuck clients (slowloris) cost a bounded number of threads
// for a bounded time. (prometheus::Exposer's civetweb threads use a fixed 100 KiB stack, smaller
// than the static TLS of the CUDA and OpenBLAS libraries linked into megatraind, so their creation
// fails with EINVAL; this server uses default-sized threads.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/registry.h"

namespace megatrain::server {

// What a handler answers for one GET request.
struct HttpReply {
  std::string status = "200 OK";  // "404 Not Found", ...
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra response headers
};

struct MetricsHttpOptions {
  absl::Duration request_deadline = absl::Seconds(5);  // from accept to the request's end
  absl::Duration send_timeout = absl::Seconds(5);      // for the whole response
  int max_connections = 16;  // accepted and not yet closed; more are answered 503 and closed
  int threads = 4;           // serving threads
  // Test hook: called when a connection is closed, with why ("served", "request_deadline",
  // "send_timeout", "over_connection_cap", "client_closed", "request_too_large", "stopping").
  std::function<void(absl::string_view reason)> on_close;
  // Answers GET requests for paths other than /metrics: called on a serving thread with the
  // request target (path and query) and the Host header ("" when absent); nullopt = 404. Its
  // reply is sent within the same send timeout.
  std::function<std::optional<HttpReply>(absl::string_view target, absl::string_view host)> handler;
};

class MetricsHttpServer {
 public:
  // `address` is "127.0.0.1:<port>", "localhost:<port>" or "[::1]:<port>"; port 0 = any free one.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      MetricsHttpOptions options = {});
  ~MetricsHttpServer();  // stops accepting, closes every connection, joins the threads
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int fd, int port, std::shared_ptr<prometheus::Registry> registry,
                    MetricsHttpOptions options)
      : fd_(fd), port_(port), registry_(std::move(registry)), options_(std::move(options)) {}
  void Accept();
  void Work();
  // Reads the request head within the deadline and answers it; returns why it closes.
  absl::string_view Answer(int client);
  void Close(int client, absl::string_view reason);

  const int fd_;
  const int port_;
  std::shared_ptr<prometheus::Registry> registry_;
  const MetricsHttpOptions options_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<int> accepted_;  // waiting for a serving thread; guarded by mu_
  int open_ = 0;              // accepted and not yet closed; guarded by mu_
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

}  // namespace megatrain::server
