// MetricsHttpServer (see metrics_http.h).
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace megatrain::server {
namespace {

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
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
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(fd, actual, std::move(registry)));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  stopping_ = true;
  shutdown(fd_, SHUT_RDWR);  // wakes poll()
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void MetricsHttpServer::Serve() {
  while (!stopping_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    if (stopping_) break;
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    Answer(client);
    close(client);
  }
}

void MetricsHttpServer::Answer(int client) {
  // Read the request head (bounded: 8 KiB, 2 s).
  std::string request;
  char buffer[1024];
  while (request.size() < 8192 && !absl::StrContains(request, "\r\n\r\n")) {
    pollfd p{client, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    const ssize_t n = recv(client, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  } else {
    status = "404 Not Found";
    body = "only GET /metrics is served\n";
  }
  WriteAll(client, absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                                "\r\nContent-Length: ", body.size(),
                                "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace megatrain::server
