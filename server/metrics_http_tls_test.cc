// MetricsHttpServer exposed (TLS + HttpAuth) and its event streams, against real sockets and a
// real OpenSSL client: a stalled handshake holds its connection slot only until the request
// deadline; plain HTTP to the TLS port gets no HTTP answer, TLS 1.0/1.1 no handshake; no token / a
// wrong one is 401 (and reported with the peer), the token 200; /login sets a cookie that then
// passes; a non-loopback address needs TLS and a token; event streams are capped and end when their
// client closes. Every wait is on an event (the server's close hook, a socket closing), bounded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics_http.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kToken[] = "0123456789abcdef-token";

class CloseEvents {
 public:
  std::function<void(absl::string_view)> Hook() {
    return [this](absl::string_view reason) {
      std::lock_guard<std::mutex> lock(mu_);
      reasons_.emplace_back(reason);
      cv_.notify_all();
    };
  }
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

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Reads until the server closes the connection (bounded); "TIMEOUT" otherwise.
std::string ReadToClose(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string got;
  char buffer[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return got;
    got.append(buffer, static_cast<size_t>(n));
  }
  return "TIMEOUT";
}

// A self-signed P-256 certificate for 127.0.0.1 and its key, as PEM files in the test's tmpdir.
struct CertFiles {
  std::string cert, key;
};
CertFiles MakeCert() {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string base =
      std::string(dir ? dir : "/tmp") + "/metrics_http_tls_" + std::to_string(getpid());
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x509 = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(x509), 1);
  X509_gmtime_adj(X509_getm_notBefore(x509), -60);
  X509_gmtime_adj(X509_getm_notAfter(x509), 24 * 3600);
  X509_set_pubkey(x509, key);
  X509_NAME* name = X509_get_subject_name(x509);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(x509, name);
  X509_sign(x509, key, EVP_sha256());
  CertFiles files{base + "_cert.pem", base + "_key.pem"};
  FILE* out = std::fopen(files.cert.c_str(), "w");
  PEM_write_X509(out, x509);
  std::fclose(out);
  out = std::fopen(files.key.c_str(), "w");
  PEM_write_PrivateKey(out, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(out);
  X509_free(x509);
  EVP_PKEY_free(key);
  return files;
}

// One request over TLS (the certificate is not verified: the test made it); the whole answer,
// or "" when the handshake failed. `max_version` caps the client's protocol version; the
// client's security level is 0 so that it would offer TLS 1.0/1.1 when asked to.
std::string TlsRequest(int port, const std::string& request, int max_version = 0) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_security_level(ctx, 0);
  SSL_CTX_set_min_proto_version(ctx, TLS1_VERSION);
  if (max_version != 0) SSL_CTX_set_max_proto_version(ctx, max_version);
  SSL* ssl = SSL_new(ctx);
  const int fd = Connect(port);
  timeval timeout{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  SSL_set_fd(ssl, fd);
  std::string got;
  if (SSL_connect(ssl) == 1) {
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    char buffer[4096];
    int n;
    while ((n = SSL_read(ssl, buffer, sizeof(buffer))) > 0) got.append(buffer, n);
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return got;
}

class MetricsHttpTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // as megatraind: OpenSSL writes with write(2)
    files_ = MakeCert();
    absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
        TlsContext::Load(files_.cert, files_.key);
    ASSERT_TRUE(tls.ok()) << tls.status();
    options_.tls = *tls;
    options_.auth = &auth_;
    options_.exposed = true;
    options_.on_close = closes_.Hook();
    options_.on_auth = [this](absl::string_view what, absl::string_view peer,
                              absl::string_view target) {
      std::lock_guard<std::mutex> lock(mu_);
      auth_events_.push_back(absl::StrCat(what, " ", peer, " ", target));
    };
  }

  std::unique_ptr<MetricsHttpServer> Start() {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start("127.0.0.1:0", std::make_shared<prometheus::Registry>(), options_);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }

  CertFiles files_;
  HttpAuth auth_{kToken, absl::Minutes(5)};
  CloseEvents closes_;
  MetricsHttpOptions options_;
  std::mutex mu_;
  std::vector<std::string> auth_events_;
};

TEST_F(MetricsHttpTlsTest, TokenOrSessionRequired) {
  std::unique_ptr<MetricsHttpServer> server = Start();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string none = TlsRequest(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(none, StartsWith("HTTP/1.1 401 Unauthorized\r\n"));
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Bearer\r\n"));
  const std::string wrong = TlsRequest(
      port, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer 0123456789abcdef-tokeN\r\n\r\n");
  // The same answer whatever was wrong.
  EXPECT_EQ(wrong.substr(wrong.find("\r\n\r\n")), none.substr(none.find("\r\n\r\n")));
  EXPECT_THAT(TlsRequest(port, absl::StrCat("GET /metrics HTTP/1.1\r\nAuthorization: Bearer ",
                                            kToken, "\r\n\r\n")),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(auth_events_.size(), 2u);
    EXPECT_THAT(auth_events_[0],
                ::testing::MatchesRegex("unauthorized 127\\.0\\.0\\.1:[0-9]+ /metrics"));
  }
  // The login form and its cookie.
  EXPECT_THAT(TlsRequest(port, "GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
              AllOf(StartsWith("HTTP/1.1 200 OK\r\n"), HasSubstr("name=\"token\"")));
  EXPECT_THAT(TlsRequest(port, "POST /login HTTP/1.1\r\nContent-Length: 9\r\n\r\ntoken=bad"),
              StartsWith("HTTP/1.1 401 Unauthorized\r\n"));
  const std::string body = absl::StrCat("token=", kToken);
  const std::string login = TlsRequest(
      port,
      absl::StrCat("POST /login HTTP/1.1\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
  ASSERT_THAT(login, StartsWith("HTTP/1.1 303 See Other\r\n"));
  const size_t at = login.find("Set-Cookie: ") + 12;
  const std::string cookie = login.substr(at, login.find(';', at) - at);
  EXPECT_THAT(
      TlsRequest(port, absl::StrCat("GET /metrics HTTP/1.1\r\nCookie: ", cookie, "\r\n\r\n")),
      StartsWith("HTTP/1.1 200 OK\r\n"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(auth_events_.size(), 4u);
    EXPECT_THAT(auth_events_[2],
                ::testing::MatchesRegex("login_refused 127\\.0\\.0\\.1:[0-9]+ /login"));
    EXPECT_THAT(auth_events_[3], ::testing::MatchesRegex("login 127\\.0\\.0\\.1:[0-9]+ /login"));
  }
  // A browser's page load without a session: still 401, with a link to the form.
  EXPECT_THAT(TlsRequest(port, "GET / HTTP/1.1\r\nAccept: text/html,*/*\r\n\r\n"),
              AllOf(StartsWith("HTTP/1.1 401 Unauthorized\r\n"), HasSubstr("href=\"/login\"")));
  // A foreign Host at /login (DNS rebinding).
  EXPECT_THAT(TlsRequest(port, "GET /login HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
              StartsWith("HTTP/1.1 403 Forbidden\r\n"));
}

TEST_F(MetricsHttpTlsTest, TlsBelow12IsRefused) {
  std::unique_ptr<MetricsHttpServer> server = Start();
  ASSERT_NE(server, nullptr);
  const std::string get =
      absl::StrCat("GET /metrics HTTP/1.1\r\nAuthorization: Bearer ", kToken, "\r\n\r\n");
  EXPECT_EQ(TlsRequest(server->port(), get, TLS1_1_VERSION), "");
  EXPECT_EQ(TlsRequest(server->port(), get, TLS1_VERSION), "");
  EXPECT_TRUE(closes_.Await("tls_handshake_failed", 2, absl::Seconds(30)));
  // The same client allowed TLS 1.2 is served.
  EXPECT_THAT(TlsRequest(server->port(), get, TLS1_2_VERSION), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsHttpTlsTest, PlainHttpGetsNoAnswer) {
  std::unique_ptr<MetricsHttpServer> server = Start();
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  const std::string get = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  EXPECT_THAT(ReadToClose(fd, absl::Seconds(30)), Not(HasSubstr("HTTP/1.1")));
  EXPECT_TRUE(closes_.Await("tls_handshake_failed", 1, absl::Seconds(30)));
  close(fd);
}

TEST_F(MetricsHttpTlsTest, AStalledHandshakeHoldsItsSlotOnlyUntilTheDeadline) {
  options_.request_deadline = absl::Seconds(1);
  options_.max_connections = 1;
  options_.threads = 1;
  options_.max_event_streams = 0;
  std::unique_ptr<MetricsHttpServer> server = Start();
  ASSERT_NE(server, nullptr);
  const int stalled = Connect(server->port());  // connects, never sends a ClientHello
  const int over = Connect(server->port());
  // The stalled handshake counts against the connection cap...
  EXPECT_TRUE(closes_.Await("over_connection_cap", 1, absl::Seconds(30)));
  // ...and is closed at the request deadline, freeing its slot and thread.
  EXPECT_TRUE(closes_.Await("request_deadline", 1, absl::Seconds(30)));
  EXPECT_NE(ReadToClose(stalled, absl::Seconds(30)), "TIMEOUT");
  EXPECT_THAT(TlsRequest(server->port(), absl::StrCat("GET /metrics HTTP/1.1\r\nAuthorization: "
                                                      "Bearer ",
                                                      kToken, "\r\n\r\n")),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  close(stalled);
  close(over);
}

TEST(MetricsHttpExposureTest, ANonLoopbackAddressNeedsTlsAndAToken) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("0.0.0.0:0", std::make_shared<prometheus::Registry>(), {});
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(),
              AllOf(HasSubstr("metrics_address"), HasSubstr("tls_cert_file"), HasSubstr("token")));
  MetricsHttpOptions forced;
  forced.exposed = true;
  EXPECT_FALSE(
      MetricsHttpServer::Start("127.0.0.1:0", std::make_shared<prometheus::Registry>(), forced)
          .ok());
}

TEST(MetricsHttpStreamTest, StreamsAreCappedAndEndWithTheirClient) {
  CloseEvents closes;
  MetricsHttpOptions options;
  options.max_event_streams = 1;
  options.on_close = closes.Hook();
  options.handler = [](absl::string_view target, absl::string_view) -> std::optional<HttpReply> {
    if (target != "/events") return std::nullopt;
    HttpReply reply;
    reply.content_type = "text/event-stream";
    reply.stream = [](EventSink& sink) {
      if (!sink.Send("event: hello\ndata: 1\n\n")) return;
      while (sink.Open()) {  // until the client goes (checked each round)
        pollfd none{-1, 0, 0};
        poll(&none, 0, 20);
      }
    };
    return reply;
  };
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", std::make_shared<prometheus::Registry>(), options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string get = "GET /events HTTP/1.1\r\n\r\n";
  const int first = Connect(port);
  ASSERT_EQ(send(first, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  std::string got;
  char buffer[1024];
  while (got.find("data: 1\n\n") == std::string::npos) {
    pollfd p{first, POLLIN, 0};
    ASSERT_GT(poll(&p, 1, 30000), 0) << "no event within 30 s: " << got;
    const ssize_t n = recv(first, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0);
    got.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"));
  EXPECT_THAT(got, Not(HasSubstr("Content-Length")));
  const int second = Connect(port);
  ASSERT_EQ(send(second, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  EXPECT_THAT(ReadToClose(second, absl::Seconds(30)), StartsWith("HTTP/1.1 503"));
  // Requests still have their threads while the stream holds one.
  const int metrics = Connect(port);
  const std::string scrape = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(send(metrics, scrape.data(), scrape.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(scrape.size()));
  EXPECT_THAT(ReadToClose(metrics, absl::Seconds(30)), StartsWith("HTTP/1.1 200 OK"));
  close(first);
  EXPECT_TRUE(closes.Await("client_closed", 1, absl::Seconds(30)));
  close(second);
  close(metrics);
}

}  // namespace
}  // namespace megatrain::server
