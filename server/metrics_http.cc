// MetricsHttpServer (see metrics_http.h).
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"
#include "server/http_request.h"

namespace megatrain::server {
namespace {

constexpr size_t kMaxHead = 8192;
constexpr size_t kMaxLoginBody = 4096;

bool IsLoopbackName(absl::string_view host) {
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]";
}

// "address:port" of a peer ("[v6]:port").
std::string PeerName(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(a->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(a->sin6_port));
  }
  return "?";
}

// A listening socket on `host` ("[v6]" bracketed); -1 with `*error` set.
int Listen(const std::string& host, int port, std::string* error) {
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc =
          getaddrinfo(name.empty() ? nullptr : name.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    *error = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      *error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

std::string Head(absl::string_view status, absl::string_view type, absl::string_view extra,
                 absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra,
                      "Connection: close\r\n\r\n", body);
}

// Headers of every page the listener itself serves (the login form).
constexpr char kPageHeaders[] =
    "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Content-Security-Policy: default-src 'none'; form-action 'self'; frame-ancestors 'none'\r\n";

}  // namespace

// The EventSink of one stream: sends under the send timeout, ends with the server.
class MetricsHttpServer::Stream final : public EventSink {
 public:
  Stream(HttpConnection& connection, const std::atomic<bool>& stopping, absl::Duration timeout)
      : connection_(connection), stopping_(stopping), timeout_(timeout) {}
  bool Send(absl::string_view text) override {
    if (!Open()) return false;
    reason_ = connection_.SendAll(text, absl::Now() + timeout_);
    return reason_ == "served";
  }
  bool Open() override {
    if (!Ok()) return false;
    if (stopping_) {
      reason_ = "stopping";
    } else if (connection_.PeerClosed()) {
      reason_ = "client_closed";
    }
    return Ok();
  }
  absl::string_view reason() const { return reason_ == "served" ? "stream_ended" : reason_; }

 private:
  bool Ok() const { return reason_ == "stream_ended" || reason_ == "served"; }

  HttpConnection& connection_;
  const std::atomic<bool>& stopping_;
  const absl::Duration timeout_;
  absl::string_view reason_ = "stream_ended";
};

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
  options.exposed = options.exposed || !IsLoopbackName(host);
  if (options.exposed && (options.tls == nullptr || options.auth == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address: '", address,
                     "' is exposed (not a loopback host, or exposed rules forced) and needs TLS "
                     "(tls_cert_file, tls_key_file) and a token (token_file)"));
  }
  std::string error;
  const int fd = Listen(host == "localhost" ? "127.0.0.1" : host, port, &error);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics_address: cannot listen on '", address, "': ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int actual =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  options.max_event_streams = std::max(options.max_event_streams, 0);
  options.threads = std::max(options.threads, 1) + options.max_event_streams;
  options.max_connections = std::max(options.max_connections, 1) + options.max_event_streams;
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
  for (const Client& client : accepted_) close(client.fd);
  close(fd_);
}

void MetricsHttpServer::Closed(absl::string_view reason) {
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
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int client =
        accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) continue;
    std::unique_lock<std::mutex> lock(mu_);
    ++open_;
    if (open_ > options_.max_connections) {
      lock.unlock();
      // Best effort, never blocking: the socket is non-blocking and the answer is short. (With
      // TLS the client cannot read it; it sees the connection close.)
      if (options_.tls == nullptr) {
        const std::string busy =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        (void)send(client, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      close(client);
      Closed("over_connection_cap");
      continue;
    }
    accepted_.push_back(Client{client, PeerName(peer)});
    ready_.notify_one();
  }
}

void MetricsHttpServer::Work() {
  while (true) {
    Client client;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !accepted_.empty(); });
      if (stopping_) return;
      client = std::move(accepted_.front());
      accepted_.pop_front();
    }
    absl::string_view reason;
    {
      HttpConnection connection(client.fd, options_.tls.get());
      reason = Answer(connection, client.peer);
    }  // closed here, before the count goes down
    Closed(reason);
  }
}

bool MetricsHttpServer::HostAllowed(absl::string_view host) const {
  return server::HostAllowed(host, options_.host_names);
}

absl::string_view MetricsHttpServer::Answer(HttpConnection& connection, const std::string& peer) {
  // The handshake and the request head (at most 8 KiB), all within the request deadline however
  // they trickle.
  const absl::Time deadline = absl::Now() + options_.request_deadline;
  if (absl::string_view why = connection.Handshake(deadline, stopping_); !why.empty()) return why;
  std::string request;
  char buffer[1024];
  size_t head_end;
  while ((head_end = request.find("\r\n\r\n")) == std::string::npos) {
    if (request.size() >= kMaxHead) return "request_too_large";
    absl::string_view why;
    const size_t n = connection.Read(buffer, sizeof(buffer), deadline, stopping_, &why);
    if (n == 0) return why;
    request.append(buffer, n);
  }
  const absl::string_view head = absl::string_view(request).substr(0, head_end + 2);
  const absl::string_view method = RequestMethod(head);
  const absl::string_view target = RequestTarget(head);
  const absl::string_view path = target.substr(0, target.find('?'));
  const absl::Time send_deadline = absl::Now() + options_.send_timeout;
  auto report = [&](absl::string_view what) {
    if (options_.on_auth) options_.on_auth(what, peer, target);
  };

  if (options_.exposed && path == "/login") {
    if (!HostAllowed(HeaderValue(head, "Host"))) {
      return connection.SendAll(Head("403 Forbidden", "text/plain; charset=utf-8", "",
                                     "Host is not a name of this server\n"),
                                send_deadline);
    }
    if (method == "GET") {
      return connection.SendAll(
          Head("200 OK", "text/html; charset=utf-8", kPageHeaders, LoginPage(false)),
          send_deadline);
    }
    if (method != "POST") {
      return connection.SendAll(Head("405 Method Not Allowed", "text/plain; charset=utf-8",
                                     "Allow: GET, POST\r\n", "GET or POST /login\n"),
                                send_deadline);
    }
    size_t length = 0;
    if (!absl::SimpleAtoi(HeaderValue(head, "Content-Length"), &length) || length > kMaxLoginBody) {
      return connection.SendAll(Head("400 Bad Request", "text/plain; charset=utf-8", "",
                                     "POST /login needs a Content-Length of at most 4096\n"),
                                send_deadline);
    }
    std::string body = request.substr(head_end + 4);
    while (body.size() < length) {
      absl::string_view why;
      const size_t n = connection.Read(buffer, sizeof(buffer), deadline, stopping_, &why);
      if (n == 0) return why;
      body.append(buffer, n);
    }
    body.resize(length);
    const std::optional<std::string> cookie = options_.auth->Login(body);
    if (!cookie.has_value()) {
      report("login_refused");
      return connection.SendAll(
          Head("401 Unauthorized", "text/html; charset=utf-8", kPageHeaders, LoginPage(true)),
          send_deadline);
    }
    report("login");
    return connection.SendAll(Head("303 See Other", "text/plain; charset=utf-8",
                                   absl::StrCat("Location: /\r\nSet-Cookie: ", *cookie,
                                                "\r\nCache-Control: no-store\r\n"),
                                   "logged in\n"),
                              send_deadline);
  }
  if (options_.exposed && !options_.auth->Allows(head)) {
    report("unauthorized");
    // The same answer whatever was wrong (no token, a wrong one, an old or forged cookie); a
    // browser's page load gets a link to the login form.
    const bool html = absl::StrContains(HeaderValue(head, "Accept"), "text/html");
    return connection.SendAll(
        Head("401 Unauthorized", html ? "text/html; charset=utf-8" : "text/plain; charset=utf-8",
             absl::StrCat("WWW-Authenticate: Bearer\r\n", kPageHeaders),
             html ? "<!doctype html>\n<title>megatraind: log in</title>"
                    "<p>Unauthorized. <a href=\"/login\">Log in</a> with the daemon's token.</p>\n"
                  : "unauthorized: send 'Authorization: Bearer <token>' or log in at /login\n"),
        send_deadline);
  }

  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body, extra;
  if (method == "GET" && path == "/metrics") {
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  } else if (std::optional<HttpReply> reply =
                 method == "GET" && options_.handler
                     ? options_.handler(target, HeaderValue(head, "Host"))
                     : std::nullopt;
             reply.has_value()) {
    if (reply->stream) return RunStream(connection, *reply);
    status = std::move(reply->status);
    type = std::move(reply->content_type);
    body = std::move(reply->body);
    for (const auto& [name, value] : reply->headers)
      absl::StrAppend(&extra, name, ": ", value, "\r\n");
  } else {
    status = "404 Not Found";
    body = options_.handler ? "not found\n" : "only GET /metrics is served\n";
  }
  return connection.SendAll(Head(status, type, extra, body), send_deadline);
}

absl::string_view MetricsHttpServer::RunStream(HttpConnection& connection, HttpReply& reply) {
  const absl::Time send_deadline = absl::Now() + options_.send_timeout;
  bool admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    admitted = streams_ < options_.max_event_streams;
    if (admitted) ++streams_;
  }
  if (!admitted) {
    return connection.SendAll(Head("503 Service Unavailable", "text/plain; charset=utf-8",
                                   "Retry-After: 10\r\nCache-Control: no-store\r\n",
                                   absl::StrCat("too many event streams (max_event_streams ",
                                                options_.max_event_streams, "); poll instead\n")),
                              send_deadline);
  }
  std::string head =
      absl::StrCat("HTTP/1.1 ", reply.status, "\r\nContent-Type: ", reply.content_type, "\r\n");
  for (const auto& [name, value] : reply.headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
  absl::StrAppend(&head, "Connection: close\r\n\r\n");
  absl::string_view reason = connection.SendAll(head, send_deadline);
  if (reason == "served") {
    Stream stream(connection, stopping_, options_.send_timeout);
    reply.stream(stream);
    reason = stream.reason();
  }
  std::lock_guard<std::mutex> lock(mu_);
  --streams_;
  return reason;
}

}  // namespace megatrain::server
