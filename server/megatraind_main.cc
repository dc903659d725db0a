// megatraind: the training daemon. Reads a DaemonConfig textproto (--config), applies flag
// overrides, serves the Trainer API until SIGTERM/SIGINT/SIGHUP, then shuts down within the
// bound.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/blas_kernels.h"
#include "server/daemon.h"
#include "server/job_chat_samples.h"
#include "server/job_engine.h"
#include "server/job_tokens.h"
#include "server/sd_notify.h"
#include "server/sd_watchdog.h"
#include "server/structured_log.h"
#include "service/daemon_config.h"

ABSL_FLAG(std::string, config, "", "DaemonConfig textproto; flags below override its fields.");
ABSL_FLAG(std::string, state_dir, "", "Overrides state_dir.");
ABSL_FLAG(std::string, socket_path, "", "Overrides socket_path.");
ABSL_FLAG(std::string, socket_mode, "", "Overrides socket_mode (octal, e.g. 0660).");
ABSL_FLAG(std::string, tcp_address, "", "Overrides tcp_address.");
ABSL_FLAG(std::string, tls_cert_file, "", "Overrides tls_cert_file.");
ABSL_FLAG(std::string, tls_key_file, "", "Overrides tls_key_file.");
ABSL_FLAG(std::string, token_file, "", "Overrides token_file.");
ABSL_FLAG(std::string, metrics_address, "", "Overrides metrics_address.");
ABSL_FLAG(bool, metrics_exposed, false, "Overrides metrics_exposed (only to true).");
ABSL_FLAG(std::string, dashboard_host_names, "",
          "Overrides dashboard_host_names (comma-separated).");
ABSL_FLAG(uint32_t, max_event_streams, 0, "Overrides max_event_streams.");
ABSL_FLAG(uint32_t, dashboard_session_minutes, 0, "Overrides dashboard_session_minutes.");
ABSL_FLAG(std::string, data_roots, "", "Overrides data_roots (comma-separated).");
ABSL_FLAG(std::string, output_roots, "", "Overrides output_roots (comma-separated).");
ABSL_FLAG(std::string, device, "", "Overrides device (cpu|cuda).");
ABSL_FLAG(uint64_t, device_arena_bytes, 0, "Overrides device_arena_bytes.");
ABSL_FLAG(uint64_t, pinned_budget_bytes, 0, "Overrides pinned_budget_bytes.");
ABSL_FLAG(double, link_gbps, 0, "Overrides link_gbps.");
ABSL_FLAG(double, link_latency_us, 0, "Overrides link_latency_us.");
ABSL_FLAG(uint32_t, max_queue_length, 0, "Overrides max_queue_length.");
ABSL_FLAG(uint32_t, shutdown_timeout_seconds, 0, "Overrides shutdown_timeout_seconds.");
ABSL_FLAG(uint64_t, max_steps, 0, "Overrides max_steps.");
ABSL_FLAG(uint32_t, max_seq_len, 0, "Overrides max_seq_len.");
ABSL_FLAG(uint64_t, max_parameters, 0, "Overrides max_parameters.");
ABSL_FLAG(uint32_t, threads, 0, "Overrides threads.");
ABSL_FLAG(uint32_t, devices, 0,
          "Overrides devices (the devices the daemon drives: the CPU device instantiated that "
          "many times).");
ABSL_FLAG(uint64_t, nvme_rated_tbw_bytes, 0, "Overrides nvme_rated_tbw_bytes.");
ABSL_FLAG(double, nvme_wear_warn_share, 0, "Overrides nvme_wear_warn_share.");
ABSL_FLAG(bool, init_signing_key, false,
          "Create <state_dir>/signing_key (Ed25519, mode 0600) if missing, write "
          "signing_key.pub, print the public key and exit (scripts/install runs this).");
ABSL_FLAG(std::string, tokenize_binary, "",
          "megatrain_tokenize, run in a child process to stream every text job's corpus into a "
          "token file; empty = megatrain_tokenize beside this executable.");
ABSL_FLAG(std::string, chat_tokenize_binary, "",
          "megatrain_chat_tokenize (tools/hf_chat, Python in scripts/setup's .cache/hf-venv), run "
          "in a child process to turn a fine-tuning job's data.chat_files into an MTSFT sample "
          "file with the model directory's tokenizer and chat template; empty = "
          "megatrain_chat_tokenize beside this executable. Without it such jobs fail "
          "(FAILED_PRECONDITION).");
ABSL_FLAG(uint64_t, max_ram_bytes, 0,
          "Host memory a job's plan may use (pinned + RAM); 0 = the machine's physical RAM. "
          "A job whose plan needs more is refused at submit (RESOURCE_EXHAUSTED).");
ABSL_FLAG(std::string, admin_group, "megatrain-admin",
          "Members (and root, and the daemon's user) may cancel, pause, resume, checkpoint and "
          "audit any job and purge jobs; others only their own jobs. Empty: no group.");
ABSL_FLAG(uint32_t, max_job_crashes, 3,
          "A job during which megatraind stopped without a clean shutdown this many times since "
          "its last checkpoint or resume is FAILED (quarantined) at the next start; 0 = never.");
// gRPC limits (issue 16, point 8); 0 keeps the default shown (DaemonSettings).
ABSL_FLAG(int, max_rpc_threads, 0,
          "gRPC handler threads (resource quota); calls beyond are RESOURCE_EXHAUSTED. 0 = 64.");
ABSL_FLAG(int, max_concurrent_streams, 0,
          "Concurrent calls per client connection; more wait for a free one. 0 = 32.");
ABSL_FLAG(int, max_receive_message_bytes, 0,
          "Largest request message; larger ones are RESOURCE_EXHAUSTED. 0 = 4 MiB.");
ABSL_FLAG(int, max_send_message_bytes, 0,
          "Largest answer message; larger ones are RESOURCE_EXHAUSTED (ListJobs pages). "
          "0 = 64 MiB.");
ABSL_FLAG(int, keepalive_time_ms, 0, "The daemon pings a connection this often. 0 = 60000.");
ABSL_FLAG(int, keepalive_timeout_ms, 0,
          "A connection whose ping is not answered in this time is closed. 0 = 20000.");
ABSL_FLAG(int, max_connection_idle_ms, 0,
          "A connection without calls for this long is closed. 0 = 300000.");
ABSL_FLAG(std::string, mpirun_binary, "", "Overrides mpirun_binary.");
ABSL_FLAG(std::string, mpirun_args, "", "Overrides mpirun_args (split at spaces).");
ABSL_FLAG(std::string, rank_binary, "", "Overrides rank_binary.");
ABSL_FLAG(std::string, allowed_hosts, "", "Overrides allowed_hosts (comma-separated).");
ABSL_FLAG(uint64_t, test_hold_after_step, 0,
          "Test hook: a job that reaches this step waits after each step until it is asked to "
          "stop or checkpoint; 0 = off. Never set it in production.");
ABSL_FLAG(uint64_t, inject_device_fault_after_steps, 0,
          "Test hook (cpu device only): fault the daemon's device after this many training "
          "steps, counted over all jobs; 0 = never. Never set it in production.");

namespace {

// Written only by the signal handler (async-signal-safe), read by the shutdown thread.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int saved = errno;
  (void)!write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// A flag overrides the file when it differs from its default (so `--link_gbps=0` cannot reset a
// file's value; edit the file for that).
bool Given(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

// Flags given on the command line replace the config file's fields.
bool ApplyFlags(megatrain::v1::DaemonConfig& c) {
  if (Given("state_dir")) c.set_state_dir(absl::GetFlag(FLAGS_state_dir));
  if (Given("socket_path")) c.set_socket_path(absl::GetFlag(FLAGS_socket_path));
  if (Given("socket_mode")) {
    const std::string mode = absl::GetFlag(FLAGS_socket_mode);
    char* end = nullptr;
    const unsigned long value = std::strtoul(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0') {
      std::fprintf(stderr, "megatraind: --socket_mode='%s' is not an octal mode\n", mode.c_str());
      return false;
    }
    c.set_socket_mode(static_cast<uint32_t>(value));
  }
  if (Given("tcp_address")) c.set_tcp_address(absl::GetFlag(FLAGS_tcp_address));
  if (Given("tls_cert_file")) c.set_tls_cert_file(absl::GetFlag(FLAGS_tls_cert_file));
  if (Given("tls_key_file")) c.set_tls_key_file(absl::GetFlag(FLAGS_tls_key_file));
  if (Given("token_file")) c.set_token_file(absl::GetFlag(FLAGS_token_file));
  if (Given("metrics_address")) c.set_metrics_address(absl::GetFlag(FLAGS_metrics_address));
  if (Given("metrics_exposed")) c.set_metrics_exposed(absl::GetFlag(FLAGS_metrics_exposed));
  if (Given("dashboard_host_names")) {
    c.clear_dashboard_host_names();
    for (absl::string_view name :
         absl::StrSplit(absl::GetFlag(FLAGS_dashboard_host_names), ',', absl::SkipEmpty()))
      c.add_dashboard_host_names(std::string(name));
  }
  if (Given("max_event_streams")) c.set_max_event_streams(absl::GetFlag(FLAGS_max_event_streams));
  if (Given("dashboard_session_minutes"))
    c.set_dashboard_session_minutes(absl::GetFlag(FLAGS_dashboard_session_minutes));
  if (Given("data_roots")) {
    c.clear_data_roots();
    for (absl::string_view r :
         absl::StrSplit(absl::GetFlag(FLAGS_data_roots), ',', absl::SkipEmpty()))
      c.add_data_roots(std::string(r));
  }
  if (Given("output_roots")) {
    c.clear_output_roots();
    for (absl::string_view r :
         absl::StrSplit(absl::GetFlag(FLAGS_output_roots), ',', absl::SkipEmpty()))
      c.add_output_roots(std::string(r));
  }
  if (Given("device")) c.set_device(absl::GetFlag(FLAGS_device));
  if (Given("device_arena_bytes"))
    c.set_device_arena_bytes(absl::GetFlag(FLAGS_device_arena_bytes));
  if (Given("pinned_budget_bytes"))
    c.set_pinned_budget_bytes(absl::GetFlag(FLAGS_pinned_budget_bytes));
  if (Given("link_gbps")) c.set_link_gbps(absl::GetFlag(FLAGS_link_gbps));
  if (Given("link_latency_us")) c.set_link_latency_us(absl::GetFlag(FLAGS_link_latency_us));
  if (Given("max_queue_length")) c.set_max_queue_length(absl::GetFlag(FLAGS_max_queue_length));
  if (Given("shutdown_timeout_seconds"))
    c.set_shutdown_timeout_seconds(absl::GetFlag(FLAGS_shutdown_timeout_seconds));
  if (Given("max_steps")) c.set_max_steps(absl::GetFlag(FLAGS_max_steps));
  if (Given("max_seq_len")) c.set_max_seq_len(absl::GetFlag(FLAGS_max_seq_len));
  if (Given("max_parameters")) c.set_max_parameters(absl::GetFlag(FLAGS_max_parameters));
  if (Given("threads")) c.set_threads(absl::GetFlag(FLAGS_threads));
  if (Given("devices")) c.set_devices(absl::GetFlag(FLAGS_devices));
  if (Given("nvme_rated_tbw_bytes"))
    c.set_nvme_rated_tbw_bytes(absl::GetFlag(FLAGS_nvme_rated_tbw_bytes));
  if (Given("nvme_wear_warn_share"))
    c.set_nvme_wear_warn_share(absl::GetFlag(FLAGS_nvme_wear_warn_share));
  if (Given("mpirun_binary")) c.set_mpirun_binary(absl::GetFlag(FLAGS_mpirun_binary));
  if (Given("mpirun_args")) {
    c.clear_mpirun_args();
    for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_mpirun_args), ' ',
                                              absl::SkipEmpty()))
      c.add_mpirun_args(std::string(a));
  }
  if (Given("rank_binary")) c.set_rank_binary(absl::GetFlag(FLAGS_rank_binary));
  if (Given("allowed_hosts")) {
    c.clear_allowed_hosts();
    for (absl::string_view h :
         absl::StrSplit(absl::GetFlag(FLAGS_allowed_hosts), ',', absl::SkipEmpty()))
      c.add_allowed_hosts(std::string(h));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "megatraind: the megatrain training daemon (see docs/daemon.md).\n"
      "Example: megatraind --config=/etc/megatrain/megatraind.textproto\n"
      "         megatraind --state_dir=/tmp/mt --socket_path=/tmp/mt/s.sock "
      "--data_roots=/usr/share/games/fortunes --output_roots=/tmp/mt/out");
  absl::ParseCommandLine(argc, argv);
  using namespace megatrain::server;
  StructuredLog log(stderr);

  megatrain::v1::DaemonConfig config;
  config.set_config_version(megatrain::service::kDaemonConfigVersion);
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<megatrain::v1::DaemonConfig> loaded =
        megatrain::service::LoadDaemonConfigFile(absl::GetFlag(FLAGS_config));
    if (!loaded.ok()) {
      log.Event("config_error", {{"error", loaded.status().ToString()}});
      return 2;
    }
    config = *loaded;
  }
  if (!ApplyFlags(config)) return 2;
  if (absl::GetFlag(FLAGS_init_signing_key)) {
    // Needs only the state directory: install time, before roots and devices are configured.
    if (config.state_dir().empty() || config.state_dir()[0] != '/') {
      std::fprintf(stderr, "megatraind: --init_signing_key needs an absolute --state_dir\n");
      return 2;
    }
    std::error_code ec;
    std::filesystem::create_directories(config.state_dir(), ec);
    absl::StatusOr<megatrain::provenance::SigningKey> key =
        LoadOrCreateDaemonKey(config.state_dir());
    if (!key.ok()) {
      std::fprintf(stderr, "megatraind: %s\n", key.status().ToString().c_str());
      return 1;
    }
    std::printf("%s\n", key->public_key_hex().c_str());
    return 0;
  }
  absl::StatusOr<megatrain::service::DaemonSettings> settings =
      megatrain::service::ValidateDaemonConfig(config);
  if (!settings.ok()) {
    log.Event("config_error", {{"error", settings.status().ToString()}});
    return 2;
  }
  settings->max_ram_bytes = absl::GetFlag(FLAGS_max_ram_bytes);
  settings->max_job_crashes = absl::GetFlag(FLAGS_max_job_crashes);
  settings->admin_group = absl::GetFlag(FLAGS_admin_group);
  settings->test_hold_after_step = absl::GetFlag(FLAGS_test_hold_after_step);
  for (auto [flag, field] :
       {std::pair{&FLAGS_max_rpc_threads, &settings->max_rpc_threads},
        std::pair{&FLAGS_max_concurrent_streams, &settings->max_concurrent_streams},
        std::pair{&FLAGS_max_receive_message_bytes, &settings->max_receive_message_bytes},
        std::pair{&FLAGS_max_send_message_bytes, &settings->max_send_message_bytes},
        std::pair{&FLAGS_keepalive_time_ms, &settings->keepalive_time_ms},
        std::pair{&FLAGS_keepalive_timeout_ms, &settings->keepalive_timeout_ms},
        std::pair{&FLAGS_max_connection_idle_ms, &settings->max_connection_idle_ms}}) {
    if (const int value = absl::GetFlag(*flag); value != 0) *field = value;
  }
  if (absl::Status s = ValidateGrpcLimits(*settings); !s.ok()) {
    log.Event("config_error", {{"error", s.ToString()}});
    return 2;
  }

  // Libraries start threads before main (OpenBLAS), so a blocked-mask + sigwait scheme would
  // miss them: the handler only writes the signal number to a pipe that one thread reads.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return 1;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // SIGHUP (a closed terminal, `systemctl kill -s HUP`): the same clean stop with a checkpoint,
  // never the default silent termination (issue 16, point 14). No reload: restart to reconfigure.
  sigaction(SIGHUP, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  DeviceJobEngineOptions engine_options;
  engine_options.state_dir = settings->state_dir;
  engine_options.hosts_launch = {.daemon_config = config,
                                 .max_ram_bytes = settings->max_ram_bytes,
                                 .test_hold_after_step = settings->test_hold_after_step};
  engine_options.device = settings->device;
  engine_options.devices = settings->devices;
  engine_options.inject_device_fault_after_steps =
      absl::GetFlag(FLAGS_inject_device_fault_after_steps);
  engine_options.tokenize_binary = absl::GetFlag(FLAGS_tokenize_binary).empty()
                                       ? DefaultTokenizeBinary()
                                       : absl::GetFlag(FLAGS_tokenize_binary);
  // A missing binary is reported now: byte-tokenizer jobs then tokenize in memory and
  // SentencePiece jobs fail.
  if (access(engine_options.tokenize_binary.c_str(), X_OK) != 0) {
    log.Event("tokenize_binary_missing", {{"path", engine_options.tokenize_binary}});
  }
  engine_options.chat_tokenize_binary = absl::GetFlag(FLAGS_chat_tokenize_binary).empty()
                                            ? DefaultChatTokenizeBinary()
                                            : absl::GetFlag(FLAGS_chat_tokenize_binary);
  if (access(engine_options.chat_tokenize_binary.c_str(), X_OK) != 0) {
    // Reported now; only jobs with data.chat_files need it (they fail FAILED_PRECONDITION).
    log.Event("chat_tokenizer_missing", {{"path", engine_options.chat_tokenize_binary}});
  }
  if (const std::string blas = megatrain::kernels::cpu::SlowBlasKernelsWarning(); !blas.empty()) {
    log.Event("slow_blas_kernels", {{"warning", blas}});
  }
  absl::StatusOr<std::unique_ptr<DeviceJobEngine>> engine =
      DeviceJobEngine::Create(std::move(engine_options));
  if (!engine.ok()) {
    log.Event("start_error", {{"error", engine.status().ToString()}});
    return 1;
  }
  if (settings->test_hold_after_step != 0) {
    log.Event("test_hook",
              {{"test_hold_after_step", std::to_string(settings->test_hold_after_step)}});
  }
  if (absl::GetFlag(FLAGS_inject_device_fault_after_steps) != 0) {
    log.Event("test_hook",
              {{"inject_device_fault_after_steps",
                std::to_string(absl::GetFlag(FLAGS_inject_device_fault_after_steps))}});
  }
  // systemd's Type=notify and watchdog (issue 16, point 15); inert outside systemd.
  absl::StatusOr<SdNotifier> notifier =
      SdNotifier::Create(std::getenv("NOTIFY_SOCKET"), std::getenv("WATCHDOG_USEC"),
                         std::getenv("WATCHDOG_PID"), getpid());
  if (!notifier.ok()) {
    log.Event("start_error", {{"error", notifier.status().ToString()}});
    return 1;
  }
  unsetenv("NOTIFY_SOCKET");  // not for the helper processes the daemon starts
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(*settings, **engine, log);
  if (!daemon.ok()) {
    log.Event("start_error", {{"error", daemon.status().ToString()}});
    return 1;
  }
  if (absl::Status s =
          notifier->Notify(absl::StrCat("READY=1\nSTATUS=serving on ", settings->socket_path));
      !s.ok()) {
    log.Event("sd_notify_error", {{"error", s.ToString()}});
  }
  // Fed only while the runner answers (its lock is not stuck).
  std::optional<SdWatchdog> watchdog;
  watchdog.emplace(*notifier, log, [&daemon] {
    (void)(*daemon)->runner().Status();
    return true;
  });
  std::thread waiter([&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    log.Event("signal", {{"signal", sig == SIGTERM  ? "SIGTERM"
                                    : sig == SIGHUP ? "SIGHUP"
                                                    : "SIGINT"}});
    (void)notifier->Notify("STOPPING=1\nSTATUS=stopping: the running job checkpoints");
    if (!(*daemon)->Shutdown()) {
      log.Event("shutdown_timeout",
                {{"seconds", std::to_string(settings->shutdown_timeout_seconds)}});
      std::_Exit(1);
    }
  });
  (*daemon)->Wait();
  waiter.join();
  watchdog.reset();  // its probe uses the daemon
  daemon->reset();
  return 0;
}
