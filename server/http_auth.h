// HttpAuth: who may use the metrics/dashboard listener when it is exposed beyond loopback (TLS +
// token, like the gRPC TCP listener). A request passes with "Authorization: Bearer <token>"
// (Prometheus, curl; compared in constant time) or with the session cookie that POST /login
// sets once the token was typed into the login form (a browser cannot add a header to a page
// load, and a token in a URL would reach logs and Referer headers). A session is 32 random bytes
// (hex) from OpenSSL's RAND_bytes, remembered only as its SHA-256 with an expiry, in memory (a
// restart logs everyone out), at most kMaxSessions of them (a new one evicts the one expiring
// first). The cookie is "Secure; HttpOnly; SameSite=Strict", so page scripts cannot read it and
// other sites' pages cannot send it.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace megatrain::server {

inline constexpr char kSessionCookieName[] = "megatrain_session";
inline constexpr size_t kMaxSessions = 256;

class HttpAuth {
 public:
  using Clock = std::function<absl::Time()>;
  HttpAuth(
      std::string token, absl::Duration session_lifetime, Clock clock = [] { return absl::Now(); })
      : token_(std::move(token)), lifetime_(session_lifetime), clock_(std::move(clock)) {}

  // True when the request head carries the bearer token or a live session cookie.
  bool Allows(absl::string_view request_head) const;
  // POST /login's form body ("token=<url-encoded token>"): the Set-Cookie header value of a new
  // session when the token matches, nullopt otherwise.
  std::optional<std::string> Login(absl::string_view form_body);

 private:
  bool LiveSession(absl::string_view cookie_header) const;

  const std::string token_;
  const absl::Duration lifetime_;
  const Clock clock_;
  mutable std::mutex mu_;
  std::map<std::string, absl::Time> sessions_;  // SHA-256 of the session id -> expiry; under mu_
};

// The login form (GET /login): a password field posted to /login; `refused` adds a line saying
// the token was not accepted.
std::string LoginPage(bool refused);

}  // namespace megatrain::server
