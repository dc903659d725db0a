// `megatrain verify` (see verify_command.h).
#include "client/verify_command.h"

#include <cstdio>
#include <optional>

#include "engine/checkpoint/provenance_verify.h"
#include "engine/provenance/signing_key.h"

namespace megatrain::client {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "megatrain verify: %s\n\n%s\n", message.c_str(), kVerifyUsage);
  return provenance::kVerifyUsage;
}

}  // namespace

int RunVerifyCommand(const std::vector<std::string>& args) {
  std::optional<std::string> dir, pubkey_path, base_dir;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag, std::optional<std::string>* out) -> bool {
      if (a == flag) {
        if (i + 1 >= args.size()) return false;
        *out = args[++i];
        return true;
      }
      if (a.rfind(flag + "=", 0) == 0) {
        *out = a.substr(flag.size() + 1);
        return true;
      }
      return false;
    };
    if (a == "--help" || a == "-h") {
      std::printf("%s\n", kVerifyUsage);
      return provenance::kVerifyOk;
    }
    if (a == "--json") {
      json = true;
    } else if (a.rfind("--pubkey", 0) == 0) {
      if (!value("--pubkey", &pubkey_path)) return UsageError("--pubkey needs a FILE");
    } else if (a.rfind("--base", 0) == 0) {
      if (!value("--base", &base_dir)) return UsageError("--base needs a DIR");
    } else if (a.rfind("-", 0) == 0) {
      return UsageError("unknown flag " + a);
    } else if (dir.has_value()) {
      return UsageError("more than one DIR given");
    } else {
      dir = a;
    }
  }
  if (!dir.has_value()) return UsageError("DIR is missing");
  std::optional<std::string> pubkey;
  if (pubkey_path.has_value()) {
    absl::StatusOr<std::string> raw = provenance::ReadPublicKeyFile(*pubkey_path);
    if (!raw.ok()) {
      std::fprintf(stderr, "megatrain verify: %s\n", std::string(raw.status().message()).c_str());
      return provenance::kVerifyUsage;
    }
    pubkey = *raw;
  }
  const provenance::VerifyReport report = provenance::VerifyChain(*dir, pubkey, base_dir);
  const std::string text =
      json ? provenance::VerifyReportToJson(report) : provenance::FormatVerifyReport(report);
  std::fputs(text.c_str(), report.usage_error.empty() || json ? stdout : stderr);
  return report.ExitCode();
}

}  // namespace megatrain::client
