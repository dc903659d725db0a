// Daemon (see daemon.h).
#include "server/daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/token_auth.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& field, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<provenance::SigningKey> LoadOrCreateDaemonKey(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kSigningKeyFileName);
  absl::StatusOr<provenance::SigningKey> key = provenance::SigningKey::LoadOrCreate(path);
  if (!key.ok()) {
    return absl::Status(key.status().code(), absl::StrCat("signing key: ", key.status().message()));
  }
  if (absl::Status s = key->WritePublicKeyFile(absl::StrCat(state_dir, "/", kPublicKeyFileName));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("signing key: ", s.message()));
  }
  return key;
}

namespace {

// gRPC limits (issue 16, point 8): message sizes both ways, streams per connection, handler
// threads, keepalive and idle timeouts.
void ApplyServerLimits(const service::DaemonSettings& settings, grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(settings.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(settings.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, settings.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, settings.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, settings.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Clients may ping at most every 10 s without data; more often counts as a strike (2 = GOAWAY).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, settings.max_connection_idle_ms);
  grpc::ResourceQuota quota("megatraind");
  quota.SetMaxThreads(settings.max_rpc_threads);
  builder.SetResourceQuota(quota);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const service::DaemonSettings& settings,
                                                      JobEngine& engine, StructuredLog& log) {
  std::unique_ptr<Daemon> d(new Daemon(settings, log));
  std::error_code ec;
  std::filesystem::create_directories(settings.state_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("state_dir: cannot create '", settings.state_dir, "': ", ec.message()));
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(settings.state_dir + "/megatrain.db");
  if (!store.ok()) return store.status();
  absl::StatusOr<provenance::SigningKey> key = LoadOrCreateDaemonKey(settings.state_dir);
  if (!key.ok()) return key.status();
  d->signing_key_ = std::make_shared<const provenance::SigningKey>(*std::move(key));

  d->registry_ = std::make_shared<prometheus::Registry>();
  d->metrics_ = std::make_unique<DaemonMetrics>(*d->registry_);

  Daemon* self = d.get();
  absl::StatusOr<std::unique_ptr<JobRunner>> runner = JobRunner::Create(
      std::move(*store), engine, d->metrics_.get(), log, settings.max_queue_length,
      [self](const v1::JobSpec& spec) {
        return service::ValidateJobSpec(spec, self->settings_, self->paths_);
      },
      JobProvenanceOptions{d->signing_key_,
                           std::string(engine::DeviceKindName(settings.device.kind))},
      RunnerLimits{.max_job_crashes = settings.max_job_crashes,
                   .test_hold_after_step = settings.test_hold_after_step,
                   .test_read_hook = {},
                   .test_after_input_check = settings.test_after_input_check});
  if (!runner.ok()) return runner.status();
  d->runner_ = std::move(*runner);
  d->admins_ = std::make_unique<AdminPolicy>(settings.admin_group, geteuid());
  d->access_ = std::make_unique<JobAccess>(d->peers_, *d->admins_, *d->runner_, log);
  d->service_ =
      std::make_unique<TrainerService>(d->settings_, d->paths_, *d->runner_, d->metrics_.get(), log,
                                       *d->access_, d->signing_key_->public_key_hex());
  if (!settings.metrics_address.empty()) {
    // Host names the dashboard answers to besides loopback names: the configured ones and the
    // listener's own host when it is a specific one (users browse to https://<that>:<port>/).
    std::vector<std::string> host_names = settings.dashboard_host_names;
    const std::string own_host =
        settings.metrics_address.substr(0, settings.metrics_address.find_last_of(':'));
    if (!own_host.empty() && own_host != "0.0.0.0" && own_host != "[::]") {
      host_names.push_back(own_host);
    }
    d->dashboard_ = std::make_unique<DashboardApi>(d->settings_, *d->runner_,
                                                   d->signing_key_->public_key_hex(), host_names);
    MetricsHttpOptions http_options;
    http_options.handler = [api = d->dashboard_.get()](absl::string_view target,
                                                       absl::string_view host) {
      return api->Handle(target, host);
    };
    http_options.max_event_streams = static_cast<int>(settings.max_event_streams);
    if (settings.metrics_exposed) {
      // The TCP listener's certificate, key and token: one secret and one identity per daemon.
      absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
          TlsContext::Load(settings.tls_cert_file, settings.tls_key_file);
      if (!tls.ok()) return tls.status();
      absl::StatusOr<std::string> token = ReadTokenFile(settings.token_file);
      if (!token.ok()) return token.status();
      d->http_auth_ = std::make_unique<HttpAuth>(*std::move(token),
                                                 absl::Minutes(settings.dashboard_session_minutes));
      http_options.exposed = true;
      http_options.tls = *std::move(tls);
      http_options.auth = d->http_auth_.get();
      http_options.host_names = host_names;
      http_options.on_auth = [&log](absl::string_view what, absl::string_view peer,
                                    absl::string_view target) {
        // StructuredLog escapes control characters; the target is cut to keep lines short.
        log.Event(absl::StrCat("http_", what),
                  {{"peer", std::string(peer)}, {"target", std::string(target.substr(0, 200))}});
      };
    }
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(settings.metrics_address, d->registry_, std::move(http_options));
    if (!http.ok()) return http.status();
    d->metrics_http_ = std::move(*http);
  }

  grpc::ServerBuilder builder;
  ApplyServerLimits(settings, builder);
  std::filesystem::create_directories(std::filesystem::path(settings.socket_path).parent_path(),
                                      ec);
  if (!settings.tcp_address.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("tls_cert_file", settings.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("tls_key_file", settings.tls_key_file);
    if (!key.ok()) return key.status();
    absl::StatusOr<std::string> token = ReadTokenFile(settings.token_file);
    if (!token.ok()) return token.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
    credentials->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(*token));
    builder.AddListeningPort(settings.tcp_address, credentials, &d->tcp_port_);
  }
  builder.RegisterService(d->service_.get());
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr) {
    return absl::FailedPreconditionError(
        settings.tcp_address.empty()
            ? std::string("cannot start the gRPC server")
            : absl::StrCat("tcp_address: cannot listen on ", settings.tcp_address));
  }
  // The Unix socket is accepted by hand: each caller's SO_PEERCRED is recorded (issue 16,
  // point 12) before gRPC gets the connection.
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Start(settings.socket_path, settings.socket_mode, *d->server_, d->peers_);
  if (!listener.ok()) return listener.status();
  d->unix_listener_ = std::move(*listener);
  d->runner_->Start();
  log.Event("daemon_started",
            {{"socket", settings.socket_path},
             {"tcp_port", absl::StrCat(d->tcp_port_)},
             {"metrics_port", absl::StrCat(d->metrics_port())},
             {"metrics_tls", settings.metrics_exposed ? "true" : "false"},
             {"device", std::string(engine::DeviceKindName(settings.device.kind))},
             {"version", kDaemonVersion},
             {"public_key", d->signing_key_->public_key_hex()}});
  return d;
}

Daemon::~Daemon() { Shutdown(); }

int Daemon::metrics_port() const { return metrics_http_ == nullptr ? 0 : metrics_http_->port(); }

bool Daemon::Shutdown() {
  if (shut_down_ || runner_ == nullptr || server_ == nullptr) return true;  // never started
  shut_down_ = true;
  log_.Event("daemon_stopping", {});
  const bool stopped = runner_->Shutdown(absl::Seconds(settings_.shutdown_timeout_seconds));
  // No new connections for a server that is shutting down.
  if (unix_listener_ != nullptr) unix_listener_->Stop();
  // Watch streams end once the runner stops; give in-flight unary calls a short grace.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  log_.Event("daemon_stopped", {{"clean", stopped ? "true" : "false"}});
  return stopped;
}

void Daemon::Wait() { server_->Wait(); }

}  // namespace megatrain::server
