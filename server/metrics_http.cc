// MetricsHttpServer (see metrics_http.h).
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"

namespace megatrain::server {
namespace {

int RemainingMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  return left <= absl::ZeroDuration()
             ? 0
             : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// Sends all of `data` before `deadline`: "served", "send_timeout" or "client_closed".
absl::string_view SendAll(int fd, const std::string& data, absl::Time deadline) {
  size_t done = 0;
  while (done < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = RemainingMs(deadline);
    if (ms == 0) return "send_timeout";
    const int ready = poll(&p, 1, ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return "client_closed";
    if (ready == 0) return "send_timeout";
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return "client_closed";
    done += static_cast<size_t>(n);
  }
  return "served";
}

// "GET /x?y HTTP/1.1" -> "/x?y"; "" when the request line has no target.
absl::string_view RequestTarget(absl::string_view request) {
  const size_t start = request.find(' ');
  if (start == absl::string_view::npos) return "";
  const size_t end = request.find_first_of(" \r\n", start + 1);
  return request.substr(start + 1, end == absl::string_view::npos ? 0 : end - start - 1);
}

// The Host header's value ("" when absent).
absl::string_view HostHeader(absl::string_view request) {
  size_t at = 0;
  while ((at = request.find("\r\n", at)) != absl::string_view::npos) {
    at += 2;
    const absl::string_view line = request.substr(at, request.find("\r\n", at) - at);
    if (line.size() > 5 && absl::EqualsIgnoreCase(line.substr(0, 5), "host:")) {
      return absl::StripAsciiWhitespace(line.substr(5));
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    MetricsHttpOptions options) {
  const size_t colon = address.find_last_of(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address: '", address, "' is not host:port"));
  }
  const std::string host = address.substr(0, colon);
  const bool v6 = host == "[::1]";
  if (!v6 && host != "127.0.0.1" && host != "localhost") {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address: '", host, "' is not a loopback host"));
  }
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("metrics socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    a.sin6_addr = in6addr_loopback;
    rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (rc != 0 || listen(fd, 64) != 0) {
    const int error = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("metrics_address: cannot listen on '", address, "': ", std::strerror(error)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int actual = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  options.threads = std::max(options.threads, 1);
  options.max_connections = std::max(options.max_connections, 1);
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(fd, actual, std::move(registry), std::move(options)));
  for (int i = 0; i < server->options_.threads; ++i) {
    server->workers_.emplace_back([s = server.get()] { s->Work(); });
  }
  server->acceptor_ = std::thread([s = server.get()] { s->Accept(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  stopping_ = true;
  shutdown(fd_, SHUT_RDWR);  // wakes the acceptor's poll()
  if (acceptor_.joinable()) acceptor_.join();
  ready_.notify_all();
  for (std::thread& t : workers_) t.join();  // each gives up within its connection's deadline
  for (int client : accepted_) close(client);
  close(fd_);
}

void MetricsHttpServer::Close(int client, absl::string_view reason) {
  close(client);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --open_;
  }
  if (options_.on_close) options_.on_close(reason);
}

void MetricsHttpServer::Accept() {
  while (!stopping_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    if (stopping_) break;
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) continue;
    std::unique_lock<std::mutex> lock(mu_);
    ++open_;
    if (open_ > options_.max_connections) {
      lock.unlock();
      // Best effort, never blocking: the socket is non-blocking and the answer is short.
      const std::string busy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      (void)send(client, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      Close(client, "over_connection_cap");
      continue;
    }
    accepted_.push_back(client);
    ready_.notify_one();
  }
}

void MetricsHttpServer::Work() {
  while (true) {
    int client;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !accepted_.empty(); });
      if (stopping_) return;
      client = accepted_.front();
      accepted_.pop_front();
    }
    Close(client, Answer(client));
  }
}

absl::string_view MetricsHttpServer::Answer(int client) {
  // The request head: at most 8 KiB, all of it within the request deadline however it trickles.
  const absl::Time deadline = absl::Now() + options_.request_deadline;
  std::string request;
  char buffer[1024];
  while (!absl::StrContains(request, "\r\n\r\n")) {
    if (request.size() >= 8192) return "request_too_large";
    pollfd p{client, POLLIN, 0};
    const int ms = RemainingMs(deadline);
    if (stopping_) return "stopping";
    if (ms == 0) return "request_deadline";
    const int ready = poll(&p, 1, std::min(ms, 1000));
    if (ready < 0 && errno != EINTR) return "client_closed";
    if (ready <= 0) continue;
    const ssize_t n = recv(client, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return "client_closed";
    request.append(buffer, static_cast<size_t>(n));
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body, extra;
  const absl::string_view target = RequestTarget(request);
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  } else if (std::optional<HttpReply> reply = absl::StartsWith(request, "GET ") && options_.handler
                                                  ? options_.handler(target, HostHeader(request))
                                                  : std::nullopt;
             reply.has_value()) {
    status = std::move(reply->status);
    type = std::move(reply->content_type);
    body = std::move(reply->body);
    for (const auto& [name, value] : reply->headers)
      absl::StrAppend(&extra, name, ": ", value, "\r\n");
  } else {
    status = "404 Not Found";
    body = options_.handler ? "not found\n" : "only GET /metrics is served\n";
  }
  return SendAll(client,
                 absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                              "\r\nContent-Length: ", body.size(), "\r\n", extra,
                              "Connection: close\r\n\r\n", body),
                 absl::Now() + options_.send_timeout);
}

}  // namespace megatrain::server
