// TokenAuthProcessor (see token_auth.h).
#include "server/token_auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace megatrain::server {

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' holds ", token.size(), " bytes; at least 16 needed"));
  }
  return token;
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata, grpc::AuthContext*,
                                         OutputMetadata* consumed_auth_metadata, OutputMetadata*) {
  auto it = auth_metadata.find("authorization");
  if (it == auth_metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  const std::string value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, "Bearer ")) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization metadata is not 'Bearer <token>'");
  }
  if (!ConstantTimeEquals(value.substr(7), token_)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "bearer token is not accepted");
  }
  consumed_auth_metadata->insert(
      std::make_pair(std::string(it->first.data(), it->first.size()), value));
  return grpc::Status::OK;
}

}  // namespace megatrain::server
