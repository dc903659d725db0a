// Connect (see connection.h).
#include "client/connection.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace megatrain::client {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const ConnectionOptions& options) {
  if (options.address.empty()) {
    if (options.socket_path.empty()) {
      return absl::InvalidArgumentError("--socket: a socket path or --address is required");
    }
    return grpc::CreateChannel("unix:" + options.socket_path, grpc::InsecureChannelCredentials());
  }
  if (options.token_file.empty()) {
    return absl::InvalidArgumentError("--token_file: required with --address (TCP needs a token)");
  }
  absl::StatusOr<std::string> token = ReadFile("token_file", options.token_file);
  if (!token.ok()) return token.status();
  grpc::SslCredentialsOptions ssl;
  if (!options.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile("ca_file", options.ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::CompositeChannelCredentials(
      grpc::SslCredentials(ssl),
      grpc::AccessTokenCredentials(std::string(absl::StripAsciiWhitespace(*token))));
  return grpc::CreateChannel(options.address, credentials);
}

}  // namespace megatrain::client
