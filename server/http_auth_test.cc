// HttpAuth and the request-head reading it relies on: the bearer token (right, wrong, another
// scheme), the login form (url-encoded), session cookies (live, expired by an injected clock,
// forged, evicted past kMaxSessions) and Host names.
#include "server/http_auth.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/http_request.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

constexpr char kToken[] = "s3cret+token/with=odd&chars";

std::string Head(const std::string& headers) {
  return absl::StrCat("GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1:9\r\n", headers, "\r\n");
}

// The session id from a Set-Cookie value ("megatrain_session=<id>; ...").
std::string CookieOf(const std::string& set_cookie) {
  return set_cookie.substr(0, set_cookie.find(';'));
}

class HttpAuthTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  HttpAuth auth_{kToken, absl::Minutes(10), [this] { return now_; }};
};

TEST(HttpRequestTest, HeadParts) {
  const std::string head =
      "POST /login?x=1 HTTP/1.1\r\nhost: a.example:8\r\nCookie: a=b\r\nX-Host: no\r\n\r\n";
  EXPECT_EQ(RequestMethod(head), "POST");
  EXPECT_EQ(RequestTarget(head), "/login?x=1");
  EXPECT_EQ(HeaderValue(head, "Host"), "a.example:8");
  EXPECT_EQ(HeaderValue(head, "cookie"), "a=b");
  EXPECT_EQ(HeaderValue(head, "Authorization"), "");
  EXPECT_EQ(FormValue("a=1&token=x%2By+z%26&b=2", "token"), "x+y z&");
  EXPECT_EQ(FormValue("token=%2", "token"), "");  // cut escape
  EXPECT_EQ(FormValue("token=%zz", "token"), "");
  EXPECT_EQ(FormValue("other=1", "token"), "");
}

TEST(HttpRequestTest, HostNames) {
  EXPECT_TRUE(HostAllowed("127.0.0.1:8443", {}));
  EXPECT_TRUE(HostAllowed("Trainer.Example:8443", {"trainer.example"}));
  EXPECT_TRUE(HostAllowed("trainer.example", {"trainer.example"}));
  EXPECT_FALSE(HostAllowed("trainer.example.evil:8443", {"trainer.example"}));
  EXPECT_FALSE(HostAllowed("evil.example", {"trainer.example"}));
  EXPECT_FALSE(HostAllowed("10.0.0.5:1", {}));
  EXPECT_TRUE(HostAllowed("[fd00::5]:1", {"[fd00::5]"}));
}

TEST_F(HttpAuthTest, BearerToken) {
  EXPECT_TRUE(auth_.Allows(Head(absl::StrCat("Authorization: Bearer ", kToken, "\r\n"))));
  EXPECT_FALSE(auth_.Allows(Head("Authorization: Bearer wrong\r\n")));
  EXPECT_FALSE(auth_.Allows(Head(absl::StrCat("Authorization: Basic ", kToken, "\r\n"))));
  EXPECT_FALSE(auth_.Allows(Head(absl::StrCat("Authorization: Bearer ", kToken, "x\r\n"))));
  EXPECT_FALSE(auth_.Allows(Head("")));
}

TEST_F(HttpAuthTest, LoginSetsAStrictCookieThatExpires) {
  EXPECT_EQ(auth_.Login("token=wrong"), std::nullopt);
  EXPECT_EQ(auth_.Login(absl::StrCat("token=", kToken)), std::nullopt);  // not url-encoded
  const std::optional<std::string> set = auth_.Login("token=s3cret%2Btoken%2Fwith%3Dodd%26chars");
  ASSERT_TRUE(set.has_value());
  for (const char* attribute :
       {"; Path=/", "; Max-Age=600", "; Secure", "; HttpOnly", "; SameSite=Strict"}) {
    EXPECT_THAT(*set, HasSubstr(attribute));
  }
  const std::string cookie = CookieOf(*set);
  EXPECT_TRUE(absl::StartsWith(cookie, "megatrain_session="));
  EXPECT_EQ(cookie.size(), std::string("megatrain_session=").size() + 64);  // 32 bytes, hex
  EXPECT_TRUE(auth_.Allows(Head(absl::StrCat("Cookie: theme=dark; ", cookie, "\r\n"))));
  // Forged: another id of the same shape, or the id's prefix.
  std::string forged = cookie;
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_FALSE(auth_.Allows(Head(absl::StrCat("Cookie: ", forged, "\r\n"))));
  EXPECT_FALSE(auth_.Allows(Head(absl::StrCat("Cookie: ", cookie.substr(0, 40), "\r\n"))));
  // Two sessions are distinct.
  EXPECT_NE(CookieOf(*auth_.Login("token=s3cret%2Btoken%2Fwith%3Dodd%26chars")), cookie);
  now_ += absl::Minutes(10) - absl::Seconds(1);
  EXPECT_TRUE(auth_.Allows(Head(absl::StrCat("Cookie: ", cookie, "\r\n"))));
  now_ += absl::Seconds(1);
  EXPECT_FALSE(auth_.Allows(Head(absl::StrCat("Cookie: ", cookie, "\r\n"))));
}

TEST_F(HttpAuthTest, SessionsAreCapped) {
  const std::string form = "token=s3cret%2Btoken%2Fwith%3Dodd%26chars";
  const std::string first = CookieOf(*auth_.Login(form));
  for (size_t i = 0; i < kMaxSessions; ++i) {
    now_ += absl::Milliseconds(1);
    ASSERT_TRUE(auth_.Login(form).has_value());
  }
  // The session expiring first made room for the newest.
  EXPECT_FALSE(auth_.Allows(Head(absl::StrCat("Cookie: ", first, "\r\n"))));
}

TEST(LoginPageTest, FormPostsTheTokenToLogin) {
  EXPECT_THAT(LoginPage(false), HasSubstr("method=\"post\" action=\"/login\""));
  EXPECT_THAT(LoginPage(false), HasSubstr("type=\"password\" name=\"token\""));
  EXPECT_THAT(LoginPage(false), ::testing::Not(HasSubstr("not accepted")));
  EXPECT_THAT(LoginPage(true), HasSubstr("not accepted"));
}

}  // namespace
}  // namespace megatrain::server
