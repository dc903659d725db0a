// MetricsHttpServer against real sockets (issue 16, point 9): a request that trickles in is
// closed at the whole-request deadline, a slow client does not keep other scrapes waiting,
// connections over the cap get 503 at once, and a client that never reads is dropped at the
// send timeout. Every wait is on an event (the socket closing, the server's close hook) with a
// bounded timeout, never on elapsed time.
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/gauge.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

// The server's close hook, recorded for bounded waits.
class CloseEvents {
 public:
  std::function<void(absl::string_view)> Hook() {
    return [this](absl::string_view reason) {
      std::lock_guard<std::mutex> lock(mu_);
      reasons_.emplace_back(reason);
      cv_.notify_all();
    };
  }
  // True when `count` closes with `reason` happened within `timeout`.
  bool Await(const std::string& reason, int count, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
      return std::count(reasons_.begin(), reasons_.end(), reason) >= count;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> reasons_;
};

int Connect(int port, int receive_buffer = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (receive_buffer > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Reads until the server closes the connection (bounded); returns what came, or "TIMEOUT".
std::string ReadToClose(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string got;
  char buffer[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return got;  // EOF or reset: closed
    got.append(buffer, static_cast<size_t>(n));
  }
  return "TIMEOUT";
}

// Sends one byte of a header that never ends every `pace` until the server closes the
// connection or `stop` is set; true when the server closed it. Bounded by `timeout`.
bool Trickle(int fd, absl::Duration pace, absl::Duration timeout, const std::atomic<bool>& stop) {
  const std::string start = "GET /metrics HTTP/1.1\r\nX-Slow: ";
  if (send(fd, start.data(), start.size(), MSG_NOSIGNAL) < 0) return true;
  const absl::Time deadline = absl::Now() + timeout;
  while (!stop && absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(pace))) > 0) {
      char c;
      if (recv(fd, &c, 1, 0) <= 0) return true;
    }
    if (send(fd, "a", 1, MSG_NOSIGNAL) < 0) return true;
  }
  return false;
}

std::unique_ptr<MetricsHttpServer> StartServer(
    MetricsHttpOptions options,
    std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>()) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", std::move(registry), std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

TEST(MetricsHttpTest, ATricklingRequestIsClosedAtTheWholeRequestDeadline) {
  CloseEvents closes;
  MetricsHttpOptions options;
  options.request_deadline = absl::Seconds(1);
  options.on_close = closes.Hook();
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  const int fd = Connect(server->port());
  const std::atomic<bool> never{false};
  // A byte every 100 ms: each wait is far below any per-read timeout, the whole never ends.
  EXPECT_TRUE(Trickle(fd, absl::Milliseconds(100), absl::Seconds(30), never))
      << "the server kept a trickling request open for 30 s";
  EXPECT_TRUE(closes.Await("request_deadline", 1, absl::Seconds(30)));
  close(fd);
}

TEST(MetricsHttpTest, ASlowClientDoesNotKeepOtherScrapesWaiting) {
  MetricsHttpOptions options;
  options.request_deadline = absl::Seconds(60);
  options.threads = 2;
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  const int slow = Connect(server->port());
  std::atomic<bool> stop{false};
  std::thread trickler([&] { Trickle(slow, absl::Milliseconds(50), absl::Seconds(60), stop); });
  const int fd = Connect(server->port());
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  EXPECT_THAT(ReadToClose(fd, absl::Seconds(30)), HasSubstr("200 OK"));
  stop = true;
  trickler.join();
  close(fd);
  close(slow);
}

TEST(MetricsHttpTest, ConnectionsOverTheCapGet503AtOnce) {
  CloseEvents closes;
  MetricsHttpOptions options;
  options.request_deadline = absl::Seconds(60);
  options.max_connections = 2;
  options.threads = 2;
  options.max_event_streams = 0;  // streams would add their own connections and threads
  options.on_close = closes.Hook();
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  const int idle1 = Connect(server->port());
  const int idle2 = Connect(server->port());
  const int over = Connect(server->port());
  EXPECT_THAT(ReadToClose(over, absl::Seconds(30)), HasSubstr("503"));
  EXPECT_TRUE(closes.Await("over_connection_cap", 1, absl::Seconds(30)));
  close(over);
  close(idle1);
  close(idle2);
  ASSERT_TRUE(closes.Await("client_closed", 2, absl::Seconds(30)));
  const int fd = Connect(server->port());  // the slots are free again
  const std::string get = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  EXPECT_THAT(ReadToClose(fd, absl::Seconds(30)), HasSubstr("200 OK"));
  close(fd);
}

TEST(MetricsHttpTest, AClientThatNeverReadsIsDroppedAtTheSendTimeout) {
  // A response of several MiB, far more than the socket buffers hold.
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildGauge().Name("test_padding").Help("padding").Register(*registry);
  for (int i = 0; i < 40000; ++i) {
    family.Add({{"label", "a_long_label_value_to_make_the_body_large_" + std::to_string(i)}});
  }
  CloseEvents closes;
  MetricsHttpOptions options;
  options.send_timeout = absl::Seconds(1);
  options.on_close = closes.Hook();
  std::unique_ptr<MetricsHttpServer> server = StartServer(options, registry);
  const int fd = Connect(server->port(), 4096);
  const std::string get = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  EXPECT_TRUE(closes.Await("send_timeout", 1, absl::Seconds(30)))
      << "a client that never reads held a serving thread for 30 s";
  close(fd);
}

// The dashboard's routes: other GET paths go to the handler with the request target and the
// Host header, its status, type and headers come back; what it declines is 404; /metrics stays
// the server's own.
TEST(MetricsHttpTest, OtherPathsGoToTheHandler) {
  MetricsHttpOptions options;
  std::vector<std::string> seen;
  std::mutex seen_mu;
  options.handler = [&](absl::string_view target,
                        absl::string_view host) -> std::optional<HttpReply> {
    std::lock_guard<std::mutex> lock(seen_mu);
    seen.push_back(std::string(target) + " " + std::string(host));
    if (target != "/api/x?y=1") return std::nullopt;
    HttpReply reply;
    reply.status = "201 Created";
    reply.body = "{}";
    reply.headers = {{"X-Test", "yes"}};
    return reply;
  };
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  auto get = [&](const std::string& request) {
    const int fd = Connect(server->port());
    EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    const std::string got = ReadToClose(fd, absl::Seconds(30));
    close(fd);
    return got;
  };
  const std::string reply = get("GET /api/x?y=1 HTTP/1.1\r\nhost: localhost:80\r\n\r\n");
  EXPECT_THAT(reply, HasSubstr("HTTP/1.1 201 Created\r\n"));
  EXPECT_THAT(reply, HasSubstr("Content-Type: application/json\r\n"));
  EXPECT_THAT(reply, HasSubstr("X-Test: yes\r\n"));
  EXPECT_THAT(reply, HasSubstr("\r\n\r\n{}"));
  EXPECT_THAT(get("GET /other HTTP/1.1\r\n\r\n"), HasSubstr("404 Not Found"));
  EXPECT_THAT(get("POST /api/x?y=1 HTTP/1.1\r\n\r\n"), HasSubstr("404 Not Found"));
  EXPECT_THAT(get("GET /metrics HTTP/1.1\r\n\r\n"), HasSubstr("200 OK"));
  std::lock_guard<std::mutex> lock(seen_mu);
  EXPECT_THAT(seen, ::testing::ElementsAre("/api/x?y=1 localhost:80", "/other "));
}

}  // namespace
}  // namespace megatrain::server
