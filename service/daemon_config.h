// DaemonConfig: loading the versioned textproto, defaults for zero fields, validation into an
// immutable DaemonSettings that the rest of the daemon reads.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device/device_options.h"
#include "engine/planner/drive_wear.h"
#include "proto/megatrain.pb.h"

namespace megatrain::service {

inline constexpr uint32_t kDaemonConfigVersion = 1;

struct DaemonSettings {
  std::string state_dir;
  std::string socket_path;
  uint32_t socket_mode = 0660;
  std::string tcp_address;  // empty = no TCP listener
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string token_file;
  std::string metrics_address;  // empty = no metrics endpoint
  // Exposed rules on the metrics/dashboard listener (TLS + token + login): metrics_exposed or a
  // non-loopback metrics_address.
  bool metrics_exposed = false;
  std::vector<std::string> dashboard_host_names;
  uint32_t max_event_streams = 2;
  uint32_t dashboard_session_minutes = 720;
  std::vector<std::string> data_roots;
  std::vector<std::string> output_roots;
  engine::DeviceOptions device;
  // Devices the daemon drives and a job may train on (JobSpec.devices): the CPU device
  // instantiated that many times (CUDA: ordinals 0..N-1), each with `device`'s options.
  uint32_t devices = 1;
  // Machines JobSpec.hosts may name besides "localhost" (DaemonConfig.allowed_hosts); with
  // any_host (an offline plan without the daemon's config, which launches nothing), any.
  std::vector<std::string> allowed_hosts;
  bool any_host = false;
  uint32_t max_queue_length = 64;
  uint32_t shutdown_timeout_seconds = 60;
  uint64_t max_steps = 10'000'000;
  uint32_t max_seq_len = 8192;
  uint64_t max_parameters = 20'000'000'000;
  int threads = 2;
  // Drive wear (nvme_rated_tbw_bytes, nvme_wear_warn_share): off when rated_tbw_bytes is 0.
  engine::planner::DriveWearLimit drive_wear;
  // Hardening (issue 16); flags only until DaemonConfig (proto/) carries them.
  uint64_t max_ram_bytes = 0;    // 0 = physical RAM; jobs whose host plan exceeds it are refused
  // Set only where a job is planned for another machine (`megatrain plan --scaling` on a
  // hardware profile): this machine's RAM and the daemon's arena and pinned budget say nothing
  // about that one's, so none refuses the job (the planner then judges the profile's device).
  // Memory fields the spec sets itself are still checked as the daemon would.
  bool plan_for_other_machine = false;
  // Ranks of a job on several machines that run on this machine (megatrain_rank: MPI's local
  // size), for its host-memory check; 0 = the most any one host of the job runs (the daemon,
  // which sees only its own machine and takes the others to be alike).
  int ranks_on_this_machine = 0;
  // This process's rank where it is one of a job's ranks (megatrain_rank); -1 in the daemon.
  int rank = -1;
  uint32_t max_job_crashes = 3;  // daemon deaths while one job ran before it is FAILED
  uint64_t test_hold_after_step = 0;  // test hook: see --test_hold_after_step
  // Test hook for in-process daemons (RunnerLimits::test_after_input_check); never set by flags.
  std::function<void(const std::string& id)> test_after_input_check;
  // Members may cancel, pause, resume, checkpoint and audit any job and purge (issue 16,
  // point 12); empty = only root and the daemon's user. Flag only (--admin_group).
  std::string admin_group = "megatrain-admin";
  // gRPC server limits (issue 16, point 8); flags only (--max_rpc_threads and so on), checked by
  // ValidateGrpcLimits.
  int max_rpc_threads = 64;         // handler threads (ResourceQuota); beyond: RESOURCE_EXHAUSTED
  int max_concurrent_streams = 32;  // per client connection
  int max_receive_message_bytes = 4 << 20;
  int max_send_message_bytes = 64 << 20;
  int keepalive_time_ms = 60'000;        // the server pings an idle transport this often
  int keepalive_timeout_ms = 20'000;     // and closes it when the ping is not answered in time
  int max_connection_idle_ms = 300'000;  // a connection without calls for this long is closed
};

// The gRPC limits above in their ranges: threads 2-4096, streams 1-10000, messages 4 KiB-1 GiB,
// keepalive time and timeout 1 s-1 day, idle close 1 s-1 day; INVALID_ARGUMENT naming the flag
// and its value otherwise.
absl::Status ValidateGrpcLimits(const DaemonSettings& settings);

// Parses a textproto DaemonConfig; INVALID_ARGUMENT with the parser's message on bad text.
absl::StatusOr<v1::DaemonConfig> ParseDaemonConfigText(const std::string& text);
absl::StatusOr<v1::DaemonConfig> LoadDaemonConfigFile(const std::string& path);

// Applies defaults for zero fields and validates every field; errors name the field and value.
absl::StatusOr<DaemonSettings> ValidateDaemonConfig(const v1::DaemonConfig& config);

}  // namespace megatrain::service
