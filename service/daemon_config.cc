// DaemonConfig loading and validation (see daemon_config.h).
#include "service/daemon_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace megatrain::service {
namespace {

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    absl::StrAppend(&errors_, errors_.empty() ? "" : "; ", "line ", line + 1, " column ",
                    column + 1, ": ", message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("daemon config ", field, ": ", problem));
}

absl::Status CheckAbsolute(absl::string_view field, const std::string& path, bool required) {
  if (path.empty()) return required ? Invalid(field, "is required") : absl::OkStatus();
  if (path[0] != '/') return Invalid(field, absl::StrCat("'", path, "' is not an absolute path"));
  return absl::OkStatus();
}

bool IsLoopbackHostPort(const std::string& address) {
  return absl::StartsWith(address, "127.0.0.1:") || absl::StartsWith(address, "[::1]:") ||
         absl::StartsWith(address, "localhost:");
}

}  // namespace

absl::StatusOr<v1::DaemonConfig> ParseDaemonConfigText(const std::string& text) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat("daemon config: ", errors.errors()));
  }
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadDaemonConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read daemon config '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfigText(text.str());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::Status ValidateGrpcLimits(const DaemonSettings& s) {
  struct Limit {
    const char* name;
    int value;
    int min;
    int max;
  };
  constexpr int kDayMs = 24 * 3600 * 1000;
  for (const Limit& l :
       {Limit{"max_rpc_threads", s.max_rpc_threads, 2, 4096},
        Limit{"max_concurrent_streams", s.max_concurrent_streams, 1, 10000},
        Limit{"max_receive_message_bytes", s.max_receive_message_bytes, 4096, 1 << 30},
        Limit{"max_send_message_bytes", s.max_send_message_bytes, 4096, 1 << 30},
        Limit{"keepalive_time_ms", s.keepalive_time_ms, 1000, kDayMs},
        Limit{"keepalive_timeout_ms", s.keepalive_timeout_ms, 1000, kDayMs},
        Limit{"max_connection_idle_ms", s.max_connection_idle_ms, 1000, kDayMs}}) {
    if (l.value < l.min || l.value > l.max) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", l.name, "=", l.value, " is outside [", l.min, ", ", l.max, "]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonSettings> ValidateDaemonConfig(const v1::DaemonConfig& c) {
  if (c.config_version() != kDaemonConfigVersion) {
    return Invalid("config_version", absl::StrCat(c.config_version(),
                                                  " is not supported (this "
                                                  "build reads version ",
                                                  kDaemonConfigVersion, ")"));
  }
  DaemonSettings s;
  if (absl::Status st = CheckAbsolute("state_dir", c.state_dir(), true); !st.ok()) return st;
  if (absl::Status st = CheckAbsolute("socket_path", c.socket_path(), true); !st.ok()) return st;
  if (c.socket_path().size() > 100) {
    return Invalid("socket_path", absl::StrCat("'", c.socket_path(),
                                               "' is longer than the 100 "
                                               "bytes a Unix socket address holds"));
  }
  s.state_dir = c.state_dir();
  s.socket_path = c.socket_path();
  s.socket_mode = c.socket_mode() == 0 ? 0660 : c.socket_mode();
  if (s.socket_mode > 0777) {
    return Invalid("socket_mode", absl::StrFormat("0%o is not a file mode", s.socket_mode));
  }
  s.tcp_address = c.tcp_address();
  s.tls_cert_file = c.tls_cert_file();
  s.tls_key_file = c.tls_key_file();
  s.token_file = c.token_file();
  if (!s.tcp_address.empty()) {
    if (s.tls_cert_file.empty() || s.tls_key_file.empty()) {
      return Invalid(
          "tcp_address",
          "a TCP listener needs tls_cert_file and tls_key_file (refusing plaintext TCP)");
    }
    if (s.token_file.empty()) {
      return Invalid("tcp_address", "a TCP listener needs token_file (bearer token)");
    }
  }
  s.metrics_address = c.metrics_address();
  s.metrics_exposed =
      c.metrics_exposed() || (!s.metrics_address.empty() && !IsLoopbackHostPort(s.metrics_address));
  if (s.metrics_exposed) {
    const absl::string_view field = c.metrics_exposed() ? "metrics_exposed" : "metrics_address";
    const std::string what = s.metrics_address.empty()
                                 ? std::string("an exposed listener")
                                 : absl::StrCat("'", s.metrics_address, "' (exposed)");
    if (s.metrics_address.empty()) return Invalid(field, "needs metrics_address");
    if (s.tls_cert_file.empty() || s.tls_key_file.empty()) {
      return Invalid(field, absl::StrCat(what,
                                         " needs tls_cert_file and tls_key_file "
                                         "(refusing plain HTTP beyond loopback)"));
    }
    if (s.token_file.empty()) {
      return Invalid(field, absl::StrCat(what, " needs token_file (bearer token)"));
    }
  }
  for (const std::string& name : c.dashboard_host_names()) {
    if (name.empty() || name.find_first_of(":/ \t\r\n") != std::string::npos) {
      return Invalid("dashboard_host_names",
                     absl::StrCat("'", name, "' is not a host name (no port, no spaces)"));
    }
    s.dashboard_host_names.push_back(name);
  }
  if (c.max_event_streams() != 0) s.max_event_streams = c.max_event_streams();
  if (s.max_event_streams > 64) {
    return Invalid("max_event_streams", absl::StrCat(s.max_event_streams, " is over 64"));
  }
  if (c.dashboard_session_minutes() != 0)
    s.dashboard_session_minutes = c.dashboard_session_minutes();
  if (s.dashboard_session_minutes > 10080) {
    return Invalid("dashboard_session_minutes",
                   absl::StrCat(s.dashboard_session_minutes, " is over 10080 (a week)"));
  }
  for (const std::string& root : c.data_roots()) {
    if (absl::Status st = CheckAbsolute("data_roots", root, true); !st.ok()) return st;
    s.data_roots.push_back(root);
  }
  for (const std::string& root : c.output_roots()) {
    if (absl::Status st = CheckAbsolute("output_roots", root, true); !st.ok()) return st;
    s.output_roots.push_back(root);
  }
  if (s.data_roots.empty()) return Invalid("data_roots", "at least one root is required");
  if (s.output_roots.empty()) return Invalid("output_roots", "at least one root is required");

  absl::StatusOr<engine::DeviceKind> kind =
      engine::ParseDeviceKind(c.device().empty() ? "cpu" : c.device());
  if (!kind.ok()) return Invalid("device", kind.status().message());
  s.device.kind = *kind;
  s.device.arena_bytes = c.device_arena_bytes() == 0 ? size_t{512} << 20 : c.device_arena_bytes();
  s.device.pinned_budget_bytes =
      c.pinned_budget_bytes() == 0 ? size_t{8} << 30 : c.pinned_budget_bytes();
  s.device.link_gbps = c.link_gbps();
  s.device.link_latency_us = c.link_latency_us();
  if (absl::Status st = engine::ValidateDeviceOptions(s.device); !st.ok()) {
    return Invalid("device options", st.message());
  }
  if (c.max_queue_length() != 0) s.max_queue_length = c.max_queue_length();
  if (c.shutdown_timeout_seconds() != 0) s.shutdown_timeout_seconds = c.shutdown_timeout_seconds();
  if (c.max_steps() != 0) s.max_steps = c.max_steps();
  if (c.max_seq_len() != 0) s.max_seq_len = c.max_seq_len();
  if (c.max_parameters() != 0) s.max_parameters = c.max_parameters();
  if (c.threads() != 0) s.threads = static_cast<int>(c.threads());
  // The launcher of jobs with hosts: a name found on PATH or an absolute path, and arguments
  // without control characters (each reaches mpirun as one argument, never through a shell).
  if (!c.mpirun_binary().empty() && c.mpirun_binary()[0] != '/' &&
      c.mpirun_binary().find('/') != std::string::npos) {
    return Invalid("mpirun_binary", absl::StrCat("'", c.mpirun_binary(),
                                                 "' is neither a name on PATH nor absolute"));
  }
  if (absl::Status st = CheckAbsolute("rank_binary", c.rank_binary(), false); !st.ok()) return st;
  for (const std::string& a : c.mpirun_args()) {
    if (a.empty() || std::any_of(a.begin(), a.end(), [](unsigned char ch) { return ch < 0x20; })) {
      return Invalid("mpirun_args", absl::StrCat("'", a, "' is empty or has a control character"));
    }
  }
  for (const std::string& host : c.allowed_hosts()) {
    if (host.empty() || host[0] == '-' ||
        host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
            std::string::npos) {
      return Invalid("allowed_hosts", absl::StrCat("'", host, "' is not a host name"));
    }
    s.allowed_hosts.push_back(host);
  }
  if (c.devices() != 0) s.devices = c.devices();
  if (s.devices > 64) return Invalid("devices", absl::StrCat(s.devices, " is more than 64"));
  if (s.threads > 256) return Invalid("threads", absl::StrCat(s.threads, " is more than 256"));
  // Drive wear: off unless the drive's rated TBW is given; a share alone is a mistake.
  s.drive_wear.rated_tbw_bytes = c.nvme_rated_tbw_bytes();
  if (c.nvme_wear_warn_share() != 0) {
    if (c.nvme_rated_tbw_bytes() == 0) {
      return Invalid("nvme_wear_warn_share",
                     absl::StrCat(c.nvme_wear_warn_share(),
                                  " without nvme_rated_tbw_bytes (the drive's rated endurance)"));
    }
    s.drive_wear.warn_share = c.nvme_wear_warn_share();
  }
  if (absl::Status st = engine::planner::ValidateDriveWearLimit(s.drive_wear); !st.ok()) {
    return Invalid("nvme_wear_warn_share", st.message());
  }
  return s;
}

}  // namespace megatrain::service
