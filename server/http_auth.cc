// HttpAuth (see http_auth.h).
#include "server/http_auth.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/http_request.h"
#include "server/token_auth.h"

namespace megatrain::server {
namespace {

std::string Sha256(absl::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

}  // namespace

bool HttpAuth::Allows(absl::string_view request_head) const {
  const absl::string_view authorization = HeaderValue(request_head, "Authorization");
  if (absl::StartsWith(authorization, "Bearer ")) {
    return ConstantTimeEquals(std::string(authorization.substr(7)), token_);
  }
  return LiveSession(HeaderValue(request_head, "Cookie"));
}

bool HttpAuth::LiveSession(absl::string_view cookie_header) const {
  for (absl::string_view cookie : absl::StrSplit(cookie_header, ';')) {
    cookie = absl::StripAsciiWhitespace(cookie);
    if (!absl::ConsumePrefix(&cookie, kSessionCookieName) || !absl::ConsumePrefix(&cookie, "=")) {
      continue;
    }
    // Looked up by its hash: the map's comparisons then tell a timing observer nothing about
    // a live session id.
    const std::string key = Sha256(cookie);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(key);
    if (it != sessions_.end() && clock_() < it->second) return true;
  }
  return false;
}

std::optional<std::string> HttpAuth::Login(absl::string_view form_body) {
  if (!ConstantTimeEquals(FormValue(form_body, "token"), token_)) return std::nullopt;
  unsigned char random[32];
  if (RAND_bytes(random, sizeof(random)) != 1) return std::nullopt;
  const std::string id =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(random), 32));
  const absl::Time now = clock_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      it = it->second <= now ? sessions_.erase(it) : std::next(it);
    }
    if (sessions_.size() >= kMaxSessions) {
      auto first =
          std::min_element(sessions_.begin(), sessions_.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      sessions_.erase(first);
    }
    sessions_[Sha256(id)] = now + lifetime_;
  }
  return absl::StrCat(kSessionCookieName, "=", id,
                      "; Path=/; Max-Age=", absl::ToInt64Seconds(lifetime_),
                      "; Secure; HttpOnly; SameSite=Strict");
}

std::string LoginPage(bool refused) {
  return absl::StrCat(
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>megatraind: log in</title></head><body>"
      "<h1>megatraind dashboard</h1>",
      refused ? "<p id=\"refused\">That token was not accepted.</p>" : "",
      "<form method=\"post\" action=\"/login\">"
      "<label>Token <input type=\"password\" name=\"token\" id=\"token\" "
      "autocomplete=\"current-password\" required></label> "
      "<button type=\"submit\" id=\"login\">Log in</button></form></body></html>\n");
}

}  // namespace megatrain::server
