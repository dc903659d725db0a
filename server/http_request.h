// Reading an HTTP/1.1 request head (as the metrics/dashboard listener received it): its method,
// target and header values. Only what the listener needs; no folding, no repeated headers.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace megatrain::server {

// "GET /x?y HTTP/1.1" -> "GET"; "" when there is no space.
absl::string_view RequestMethod(absl::string_view head);
// "GET /x?y HTTP/1.1" -> "/x?y"; "" when the request line has no target.
absl::string_view RequestTarget(absl::string_view head);
// The first header named `name` (case-insensitive), its value without surrounding whitespace;
// "" when absent.
absl::string_view HeaderValue(absl::string_view head, absl::string_view name);
// The value of `name` in a query string or form body ("a=1&b=2"), percent- and '+'-decoded;
// "" when absent or badly encoded.
std::string FormValue(absl::string_view form, absl::string_view name);

// True for "127.0.0.1", "localhost", "[::1]" with or without ":<port>", and for "".
bool IsLoopbackHost(absl::string_view host);
// A Host header the listener serves: a loopback name, or (port stripped) one of `names`
// (case-insensitive). Anything else is refused, so a page elsewhere cannot read the API through
// DNS rebinding.
bool HostAllowed(absl::string_view host, const std::vector<std::string>& names);

}  // namespace megatrain::server
