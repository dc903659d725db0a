// TokenAuthProcessor: the TCP listener's bearer-token check ("authorization: Bearer <token>"),
// compared in constant time.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace megatrain::server {

// Equal-length-independent constant-time comparison (time depends only on the lengths).
bool ConstantTimeEquals(const std::string& a, const std::string& b);

// Reads a token file: surrounding whitespace dropped; empty or missing is an error.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  // No token: UNAUTHENTICATED; a wrong token: PERMISSION_DENIED.
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::string token_;
};

}  // namespace megatrain::server
