// DashboardApi: the dashboard's routes on the daemon's loopback HTTP listener: its static page
// (embedded at build time, dashboard_assets.h) and read-only JSON built from what the gRPC API
// answers (the proto messages in their JSON mapping, field names as in the .proto):
//   GET /                 the page (index.html; dashboard.js and dashboard.css beside it)
//   GET /api/daemon       DaemonStatus, plus the running job's RAM against max_ram_bytes (or
//                         the physical RAM when that is 0)
//   GET /api/jobs         {"jobs": [Job...]}: the newest kMaxDashboardJobs jobs, oldest first
//   GET /api/jobs/<id>    {"job": Job, "history": JobHistory,
//                          "checkpoints": {"checkpoints": [CheckpointRecord...]},
//                          "checkpoint_checks": [one per checkpoint, in order]}
//   GET /api/events[?job=<id>]  server-sent events (text/event-stream): at once and after every
//                         change the runner reports (a step, a state, a submit; at most one round
//                         per kMinEventInterval, later changes coalesced into it), an event "jobs"
//                         {"daemon": /api/daemon, "list": /api/jobs} and, with ?job=, an
//                         event "job" (/api/jobs/<id>, the whole bounded history: the page
//                         redraws from it); a ": keepalive" comment after 15 s without a change.
//                         The stream ends when the client goes, the daemon stops, or a send
//                         misses the send timeout; EventSource reconnects.
// A checkpoint's check is quick, not `megatrain verify`: its manifest.json is hashed again and
// compared with the SHA-256 recorded when it was committed: "manifest_matches",
// "manifest_changed", "missing" (unreadable or removed by retention), "not_hashed" (nothing was
// recorded) or "not_checked" (older than the newest kCheckedCheckpoints).
// Jobs are served without their input and output paths (spec.model, spec.data,
// spec.output_dir, memory.nvme_dir, resolved_output_dir, submitter_uid): on loopback the
// listener has no authentication. A Host header that is not a loopback name (or, when exposed,
// one of the configured host names) is refused (403), so a web page elsewhere cannot read the
// API through DNS rebinding.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/http_request.h"
#include "server/job_runner.h"
#include "server/metrics_http.h"
#include "service/daemon_config.h"

namespace megatrain::server {

inline constexpr size_t kMaxDashboardJobs = 200;
inline constexpr size_t kCheckedCheckpoints = 16;
inline constexpr absl::Duration kEventKeepalive = absl::Seconds(15);
inline constexpr absl::Duration kMinEventInterval = absl::Milliseconds(500);

class DashboardApi {
 public:
  // Everything passed in outlives the API. `host_names`: Host values accepted besides loopback
  // names (HostAllowed).
  DashboardApi(const service::DaemonSettings& settings, const JobRunner& runner,
               std::string public_key_hex, std::vector<std::string> host_names = {})
      : settings_(settings),
        runner_(runner),
        public_key_hex_(std::move(public_key_hex)),
        host_names_(std::move(host_names)) {}

  // A MetricsHttpOptions::handler: nullopt for paths it does not serve.
  std::optional<HttpReply> Handle(absl::string_view target, absl::string_view host) const;

 private:
  HttpReply Daemon() const;
  HttpReply Jobs() const;
  HttpReply Job(const std::string& id) const;
  HttpReply Events(std::string job_id) const;
  // One round of /api/events: the "jobs" event and, for a job id, its "job" event.
  std::string EventsText(const std::string& job_id) const;

  const service::DaemonSettings& settings_;
  const JobRunner& runner_;
  const std::string public_key_hex_;
  const std::vector<std::string> host_names_;
};

}  // namespace megatrain::server
