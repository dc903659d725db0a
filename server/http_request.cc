// Request-head reading (see http_request.h).
#include "server/http_request.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace megatrain::server {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::string_view RequestMethod(absl::string_view head) {
  const size_t space = head.find(' ');
  return space == absl::string_view::npos ? "" : head.substr(0, space);
}

absl::string_view RequestTarget(absl::string_view head) {
  const size_t start = head.find(' ');
  if (start == absl::string_view::npos) return "";
  const size_t end = head.find_first_of(" \r\n", start + 1);
  return head.substr(start + 1, end == absl::string_view::npos ? 0 : end - start - 1);
}

absl::string_view HeaderValue(absl::string_view head, absl::string_view name) {
  size_t at = 0;
  while ((at = head.find("\r\n", at)) != absl::string_view::npos) {
    at += 2;
    const size_t end = head.find("\r\n", at);
    const absl::string_view line =
        head.substr(at, end == absl::string_view::npos ? absl::string_view::npos : end - at);
    if (line.size() > name.size() && line[name.size()] == ':' &&
        absl::EqualsIgnoreCase(line.substr(0, name.size()), name)) {
      return absl::StripAsciiWhitespace(line.substr(name.size() + 1));
    }
  }
  return "";
}

std::string FormValue(absl::string_view form, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(form, '&')) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos || pair.substr(0, eq) != name) continue;
    const absl::string_view encoded = pair.substr(eq + 1);
    std::string value;
    for (size_t i = 0; i < encoded.size(); ++i) {
      if (encoded[i] == '+') {
        value.push_back(' ');
      } else if (encoded[i] == '%') {
        if (i + 2 >= encoded.size()) return "";
        const int hi = HexDigit(encoded[i + 1]), lo = HexDigit(encoded[i + 2]);
        if (hi < 0 || lo < 0) return "";
        value.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
      } else {
        value.push_back(encoded[i]);
      }
    }
    return value;
  }
  return "";
}

bool IsLoopbackHost(absl::string_view host) {
  if (host.empty()) return true;
  for (absl::string_view name : {"127.0.0.1", "localhost", "[::1]"}) {
    if (host == name) return true;
    if (absl::StartsWith(host, name) && host.size() > name.size() && host[name.size()] == ':') {
      return true;
    }
  }
  return false;
}

bool HostAllowed(absl::string_view host, const std::vector<std::string>& names) {
  if (IsLoopbackHost(host)) return true;
  // "[v6]:port" keeps its brackets; "name:port" loses the port.
  const size_t colon = host.rfind(':');
  const size_t bracket = host.rfind(']');
  if (colon != absl::string_view::npos && (bracket == absl::string_view::npos || colon > bracket)) {
    host = host.substr(0, colon);
  }
  for (const std::string& name : names) {
    if (!name.empty() && absl::EqualsIgnoreCase(host, name)) return true;
  }
  return false;
}

}  // namespace megatrain::server
