// Daemon: megatraind assembled from validated settings: state directory and store, metrics
// endpoint and dashboard (one HTTP listener: loopback, or exposed with TLS + token), job runner,
// Trainer service on the Unix socket (and TCP with TLS + token).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/provenance/signing_key.h"
#include "grpcpp/server.h"
#include "prometheus/registry.h"
#include "server/dashboard_api.h"
#include "server/http_auth.h"
#include "server/job_access.h"
#include "server/job_engine.h"
#include "server/job_runner.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/peer_identity.h"
#include "server/structured_log.h"
#include "server/trainer_service.h"
#include "server/unix_listener.h"
#include "service/daemon_config.h"
#include "service/path_policy.h"
#include "server/signing_key_files.h"

namespace megatrain::server {

// Loads <state_dir>/signing_key, creating it when missing, and (re)writes signing_key.pub.
absl::StatusOr<provenance::SigningKey> LoadOrCreateDaemonKey(const std::string& state_dir);

class Daemon {
 public:
  // Opens <state_dir>/megatrain.db, loads (or creates) the signing key, starts the metrics
  // endpoint, the runner and the listeners. `engine` and `log` outlive the daemon.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const service::DaemonSettings& settings,
                                                       JobEngine& engine, StructuredLog& log);
  ~Daemon();

  // Bounded shutdown: stop taking jobs, interrupt the running job (re-queued for the next
  // start), close the listeners. False when the job did not stop within the configured timeout.
  bool Shutdown();
  // Blocks until Shutdown() closed the listeners.
  void Wait();

  int metrics_port() const;  // 0 without a metrics endpoint
  int tcp_port() const { return tcp_port_; }
  const provenance::SigningKey& signing_key() const { return *signing_key_; }
  JobRunner& runner() { return *runner_; }

 private:
  Daemon(const service::DaemonSettings& settings, StructuredLog& log)
      : settings_(settings), paths_(settings.data_roots, settings.output_roots), log_(log) {}

  const service::DaemonSettings settings_;
  const service::PathPolicy paths_;
  StructuredLog& log_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<DaemonMetrics> metrics_;
  std::shared_ptr<const provenance::SigningKey> signing_key_;
  std::unique_ptr<JobRunner> runner_;
  PeerRegistry peers_;
  std::unique_ptr<AdminPolicy> admins_;
  std::unique_ptr<JobAccess> access_;
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixListener> unix_listener_;  // after server_: stopped and destroyed first
  std::unique_ptr<DashboardApi> dashboard_;
  std::unique_ptr<HttpAuth> http_auth_;  // exposed metrics/dashboard listener only
  // Last: stopped and destroyed first, its handler reads dashboard_ and runner_.
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  int tcp_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace megatrain::server
