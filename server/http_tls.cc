// TlsContext and HttpConnection (see http_tls.h).
#include "server/http_tls.h"

#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace megatrain::server {
namespace {

int RemainingMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  return left <= absl::ZeroDuration()
             ? 0
             : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof(text));
    absl::StrAppend(&out, out.empty() ? "" : "; ", text);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Load(const std::string& cert_file,
                                                                   const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS context: ", OpenSslErrors()));
  std::shared_ptr<const TlsContext> owned(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Partial writes: SendAll keeps its own offset; the buffer may move between retries.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_cert_file: cannot load '", cert_file, "': ", OpenSslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_key_file: cannot load '", key_file, "': ", OpenSslErrors()));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("tls_key_file: '", key_file,
                                                   "' does not match tls_cert_file '", cert_file,
                                                   "': ", OpenSslErrors()));
  }
  return owned;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

HttpConnection::HttpConnection(int fd, const TlsContext* tls) : fd_(fd), tls_(tls != nullptr) {
  if (tls == nullptr) return;
  ssl_ = SSL_new(tls->ctx());
  if (ssl_ != nullptr) SSL_set_fd(ssl_, fd_);
}

HttpConnection::~HttpConnection() {
  if (ssl_ != nullptr) {
    if (SSL_is_init_finished(ssl_)) (void)SSL_shutdown(ssl_);  // non-blocking: best effort
    SSL_free(ssl_);
    ERR_clear_error();
  }
  close(fd_);
}

absl::string_view HttpConnection::Await(short events, absl::Time deadline,
                                        const std::atomic<bool>* stopping,
                                        absl::string_view deadline_reason) {
  while (true) {
    if (stopping != nullptr && *stopping) return "stopping";
    const int ms = RemainingMs(deadline);
    if (ms == 0) return deadline_reason;
    pollfd p{fd_, events, 0};
    const int ready = poll(&p, 1, std::min(ms, 1000));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return "client_closed";
    if (ready > 0) return "";
  }
}

absl::string_view HttpConnection::Handshake(absl::Time deadline,
                                            const std::atomic<bool>& stopping) {
  if (!tls_) return "";
  if (ssl_ == nullptr) return "tls_handshake_failed";  // SSL_new failed: never fall back to plain
  while (true) {
    ERR_clear_error();
    const int rc = SSL_accept(ssl_);
    if (rc == 1) return "";
    const int error = SSL_get_error(ssl_, rc);
    short events;
    if (error == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (error == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else {
      ERR_clear_error();
      return "tls_handshake_failed";
    }
    if (absl::string_view why = Await(events, deadline, &stopping, "request_deadline");
        !why.empty()) {
      return why;
    }
  }
}

size_t HttpConnection::Read(char* buffer, size_t size, absl::Time deadline,
                            const std::atomic<bool>& stopping, absl::string_view* reason) {
  while (true) {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      const int n = SSL_read(ssl_, buffer, static_cast<int>(std::min<size_t>(size, 1 << 20)));
      if (n > 0) return static_cast<size_t>(n);
      const int error = SSL_get_error(ssl_, n);
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
        *reason = "client_closed";
        return 0;
      }
      *reason = Await(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, &stopping,
                      "request_deadline");
    } else {
      const ssize_t n = recv(fd_, buffer, size, MSG_DONTWAIT);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        *reason = "client_closed";
        return 0;
      }
      *reason = Await(POLLIN, deadline, &stopping, "request_deadline");
    }
    if (!reason->empty()) return 0;
  }
}

absl::string_view HttpConnection::SendAll(absl::string_view data, absl::Time deadline) {
  size_t done = 0;
  while (done < data.size()) {
    short wait_for = POLLOUT;
    if (ssl_ != nullptr) {
      ERR_clear_error();
      const int n = SSL_write(ssl_, data.data() + done,
                              static_cast<int>(std::min<size_t>(data.size() - done, 1 << 20)));
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      const int error = SSL_get_error(ssl_, n);
      if (error == SSL_ERROR_WANT_READ) {
        wait_for = POLLIN;
      } else if (error != SSL_ERROR_WANT_WRITE) {
        return "client_closed";
      }
    } else {
      const ssize_t n =
          send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        return "client_closed";
      }
    }
    if (absl::string_view why = Await(wait_for, deadline, nullptr, "send_timeout"); !why.empty()) {
      return why;
    }
  }
  return "served";
}

bool HttpConnection::PeerClosed() {
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char buffer[512];
  if (ssl_ != nullptr) {
    ERR_clear_error();
    const int n = SSL_read(ssl_, buffer, sizeof(buffer));
    if (n > 0) return false;
    const int error = SSL_get_error(ssl_, n);
    return error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE;
  }
  const ssize_t n = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace megatrain::server
