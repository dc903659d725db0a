// MetricsHttpServer: serves a prometheus-cpp registry as text on GET /metrics, and any other GET
// path through an optional handler (the dashboard): one accepting thread, a few serving threads,
// a cap on open connections, and per connection a deadline for the whole request (the TLS
// handshake included) and a send timeout, so slow or stuck clients (slowloris) cost a bounded
// number of threads for a bounded time. On loopback it speaks plain HTTP to anyone; exposed
// (any other address, or forced by MetricsHttpOptions::exposed) it needs TLS and an HttpAuth:
// every path but /login then answers 401 without the bearer token or a login session cookie.
// A handler's reply may be an event stream (server-sent events), which keeps its serving thread
// until the client goes or the server stops; at most max_event_streams at once (more get 503),
// and there are that many serving threads beyond `threads`, so streams never starve requests.
// (prometheus::Exposer's civetweb threads use a fixed 100 KiB stack, smaller than the static TLS of
// the CUDA and OpenBLAS libraries linked into megatraind, so their creation fails with EINVAL; this
// server uses default-sized threads.)
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
#include "server/http_auth.h"
#include "server/http_tls.h"

namespace megatrain::server {

// An open event stream (text/event-stream) on its serving thread.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Sends `text` (whole events: "event: x\ndata: ...\n\n") within the send timeout; false when
  // the client is gone or too slow, or the server stops: the stream should end then.
  virtual bool Send(absl::string_view text) = 0;
  // False once the client closed its side or the server stops.
  virtual bool Open() = 0;
};

// What a handler answers for one GET request.
struct HttpReply {
  std::string status = "200 OK";  // "404 Not Found", ...
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra response headers
  // Set: an event stream; `body` is ignored, the head is sent without a length and `stream` runs
  // on the serving thread until it returns (the connection closes then).
  std::function<void(EventSink&)> stream;
};

struct MetricsHttpOptions {
  absl::Duration request_deadline = absl::Seconds(5);  // from accept to the request's end
  absl::Duration send_timeout = absl::Seconds(5);      // for the whole response
  int max_connections = 16;   // accepted and not yet closed (streams add max_event_streams); more
                              // are answered 503 (plain HTTP; with TLS only closed) and closed
  int threads = 4;            // serving threads for requests (streams add max_event_streams)
  int max_event_streams = 2;  // open event streams; more are answered 503
  // Exposed rules on any address (a test of them on loopback); a non-loopback address implies
  // them. Exposed needs `tls` and `auth`.
  bool exposed = false;
  std::shared_ptr<const TlsContext> tls;  // null: plain HTTP
  HttpAuth* auth = nullptr;               // null: no token; outlives the server
  // When exposed: the Host header values (port stripped) /login accepts besides loopback names
  // (the dashboard's own routes check theirs: DashboardApi).
  std::vector<std::string> host_names;
  // Called (on a serving thread) for each request refused for want of the token or a session
  // ("unauthorized"), with a wrong token at POST /login ("login_refused"), and for each login
  // ("login"), with the peer's "address:port" and the request target: the daemon logs them.
  std::function<void(absl::string_view what, absl::string_view peer, absl::string_view target)>
      on_auth;
  // Test hook: called when a connection is closed, with why ("served", "request_deadline",
  // "send_timeout", "over_connection_cap", "client_closed", "request_too_large", "stopping",
  // "tls_handshake_failed", "stream_ended").
  std::function<void(absl::string_view reason)> on_close;
  // Answers GET requests for paths other than /metrics: called on a serving thread with the
  // request target (path and query) and the Host header ("" when absent); nullopt = 404. Its
  // reply is sent within the same send timeout.
  std::function<std::optional<HttpReply>(absl::string_view target, absl::string_view host)> handler;
};

class MetricsHttpServer {
 public:
  // `address` is "<host>:<port>" ("[v6]:<port>"); port 0 = any free one. A host other than
  // "127.0.0.1", "localhost" or "[::1]" needs options.tls and options.auth (INVALID_ARGUMENT
  // naming metrics_address otherwise).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      MetricsHttpOptions options = {});
  ~MetricsHttpServer();  // stops accepting, closes every connection, joins the threads
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  struct Client {
    int fd;
    std::string peer;  // "address:port"
  };
  class Stream;

  MetricsHttpServer(int fd, int port, std::shared_ptr<prometheus::Registry> registry,
                    MetricsHttpOptions options)
      : fd_(fd), port_(port), registry_(std::move(registry)), options_(std::move(options)) {}
  void Accept();
  void Work();
  // Handshakes, reads the request within the deadline and answers it; returns why it closes.
  absl::string_view Answer(HttpConnection& connection, const std::string& peer);
  // Runs an event stream reply under the stream cap; returns why it closes.
  absl::string_view RunStream(HttpConnection& connection, HttpReply& reply);
  void Closed(absl::string_view reason);
  bool HostAllowed(absl::string_view host) const;

  const int fd_;
  const int port_;
  std::shared_ptr<prometheus::Registry> registry_;
  const MetricsHttpOptions options_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Client> accepted_;  // waiting for a serving thread; guarded by mu_
  int open_ = 0;                 // accepted and not yet closed; guarded by mu_
  int streams_ = 0;              // event streams running; guarded by mu_
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

}  // namespace megatrain::server
