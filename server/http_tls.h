// TlsContext and HttpConnection: one accepted socket of the metrics/dashboard listener, plain or
// TLS (OpenSSL, TLS 1.2 or newer). The handshake, every read and every write are bounded by a
// deadline the caller passes (the listener's per-connection deadlines) and polled in slices of
// at most a second so a stopping server is noticed; a client that stalls the handshake costs
// its serving thread no longer than the request deadline.
#pragma once

#include <openssl/ssl.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace megatrain::server {

class TlsContext {
 public:
  // Loads the PEM certificate chain and private key (the gRPC listener's tls_cert_file and
  // tls_key_file); errors name the field and the file.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Load(const std::string& cert_file,
                                                                const std::string& key_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* ctx() const { return ctx_; }

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* const ctx_;
};

class HttpConnection {
 public:
  // Owns `fd` (non-blocking). `tls` null = plain HTTP. With TLS the process must ignore SIGPIPE
  // (megatraind does): OpenSSL writes with write(2), not send(MSG_NOSIGNAL).
  HttpConnection(int fd, const TlsContext* tls);
  ~HttpConnection();  // TLS: one non-blocking close_notify; then closes the socket
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // The TLS handshake (nothing for plain HTTP): "" when done, else why the connection closes:
  // "request_deadline", "stopping", "tls_handshake_failed" (not TLS, an old version, ...).
  absl::string_view Handshake(absl::Time deadline, const std::atomic<bool>& stopping);
  // Up to `size` bytes into `buffer`; 0 with `*reason` set ("request_deadline", "stopping",
  // "client_closed") when none came.
  size_t Read(char* buffer, size_t size, absl::Time deadline, const std::atomic<bool>& stopping,
              absl::string_view* reason);
  // All of `data` before `deadline`: "served", "send_timeout" or "client_closed".
  absl::string_view SendAll(absl::string_view data, absl::Time deadline);
  // True when the client closed its side (or reset); reads and drops anything it sent.
  bool PeerClosed();

 private:
  // Waits until the socket is ready for `events`: "" or a close reason as above.
  absl::string_view Await(short events, absl::Time deadline, const std::atomic<bool>* stopping,
                          absl::string_view deadline_reason);

  const int fd_;
  const bool tls_;
  SSL* ssl_ = nullptr;
};

}  // namespace megatrain::server
