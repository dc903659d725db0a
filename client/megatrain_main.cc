// megatrain: the command-line client of megatraind; this file holds its command line (the flags,
// the usage text) and sends each command (submit, list, status, watch, cancel, pause, resume,
// checkpoint, plan, daemon-status, audit, verify) to its RPC or runner. Exit codes: exit_codes.h.
// The flags are defined here, in the binary's main file, because absl's --help lists only those.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli_flags.h"
#include "client/cli_output.h"
#include "client/command_deadline.h"
#include "client/connection.h"
#include "client/exit_codes.h"
#include "client/plan_command.h"
#include "client/render.h"
#include "client/spec_from_flags.h"
#include "client/spec_switch_flags.h"
#include "client/terminal_size.h"
#include "client/top_command.h"
#include "client/verify_command.h"
#include "client/watch_command.h"
#include "grpcpp/client_context.h"
#include "proto/megatrain.grpc.pb.h"
#include "service/audit_log.h"

ABSL_FLAG(std::string, socket, "/run/megatrain/megatraind.sock", "megatraind's Unix socket.");
ABSL_FLAG(std::string, address, "", "host:port of megatraind's TCP listener (TLS + token).");
ABSL_FLAG(std::string, token_file, "", "File holding the bearer token (with --address).");
ABSL_FLAG(std::string, ca_file, "", "PEM CA certificate of the daemon (with --address).");
ABSL_FLAG(bool, json, false, "Read commands print JSON instead of text.");
ABSL_FLAG(int, timeout_seconds, 0,
          "Deadline of the unary call in seconds; 0 = the command's own (30, checkpoint 150, "
          "resume 120).");
ABSL_FLAG(int, wait_seconds, 0, "Wait this long for the daemon to accept connections.");
ABSL_FLAG(std::string, spec, "", "submit/plan: JobSpec JSON file; flags below override it.");
ABSL_FLAG(std::string, name, "", "submit/plan: job name.");
ABSL_FLAG(std::string, model_config, "",
          "submit/plan: model config.json path on the daemon host, or builtin:tiny.");
ABSL_FLAG(std::string, text, "", "submit/plan: comma-separated text files on the daemon host.");
ABSL_FLAG(std::string, hf_directory, "",
          "submit/plan: model.hf_directory, a Hugging Face model directory on the daemon host.");
ABSL_FLAG(std::string, chat, "",
          "submit/plan: comma-separated chat / prompt-completion / Alpaca JSONL files on the "
          "daemon host (data.chat_files), tokenized with --hf_directory's tokenizer and chat "
          "template (docs/fine_tuning.md).");
ABSL_FLAG(std::string, chat_format, "",
          "submit/plan: data.chat_format: auto (default), chat, prompt_completion or alpaca.");
ABSL_FLAG(std::string, samples, "",
          "submit/plan: comma-separated pre-made MTSFT sample files (data.sample_files).");
ABSL_FLAG(std::optional<bool>, train_on_prompt, std::nullopt,
          "submit/plan: fine-tuning: count the loss on prompt tokens too (unset: the spec's "
          "data.train_on_prompt, default false: the assistant tokens only).");
ABSL_FLAG(std::optional<bool>, pack, std::nullopt,
          "submit/plan: fine-tuning: pack several samples per row (default true).");
ABSL_FLAG(std::string, overlong, "",
          "submit/plan: fine-tuning: a sample longer than seq_len + 1 tokens is truncated "
          "(truncate, the default) or fails the job (refuse).");
ABSL_FLAG(uint64_t, steps, 0, "submit/plan: optimizer steps.");
ABSL_FLAG(uint32_t, batch_size, 0,
          "submit/plan: sequences per optimizer step; unset (0) = the daemon's default 8.");
ABSL_FLAG(uint32_t, micro_batch_size, 0, "submit/plan: sequences per forward/backward.");
ABSL_FLAG(uint32_t, seq_len, 0,
          "submit/plan: tokens per sequence; unset (0) = the daemon's default 256 (capped by "
          "its max_seq_len and the model's positions).");
ABSL_FLAG(double, lr, 0,
          "submit/plan: peak learning rate; unset (0) = the daemon's default 3e-4 (cosine decay "
          "to 0, no warmup, AdamW betas 0.9/0.95, eps 1e-8).");
ABSL_FLAG(std::optional<uint64_t>, warmup_steps, std::nullopt,
          "submit/plan: linear warmup steps (0 = none, overriding the spec).");
ABSL_FLAG(std::optional<uint32_t>, eval_every, std::nullopt,
          "submit/plan: validation every N steps (0 = only at the end, overriding the spec).");
ABSL_FLAG(std::string, output_dir, "", "submit/plan: output directory on the daemon host.");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "submit/plan: seed of weights and data order (0 is a seed like any other).");
ABSL_FLAG(double, older_than_days, 0, "purge: jobs that ended more than this many days ago.");
ABSL_FLAG(bool, reuse_output_dir, false,
          "submit: write into --output_dir although a finished job used it (refused otherwise); "
          "the job's checkpoints go to <output_dir>/checkpoints/<job id>.");
ABSL_FLAG(bool, watch, false, "submit: watch the job after submitting it.");
ABSL_FLAG(std::string, state, "", "list: comma-separated states to show (e.g. RUNNING,QUEUED).");
ABSL_FLAG(double, interval_seconds, 2, "top: seconds between screens.");
ABSL_FLAG(int, iterations, -1,
          "top: screens to draw; 0 = until interrupted; default: until interrupted on a "
          "terminal, once otherwise.");
ABSL_FLAG(bool, offline, false,
          "plan: run the engine planner in-process instead of asking a daemon (also the "
          "fallback when no daemon answers).");
ABSL_FLAG(bool, allow_data_change, false,
          "resume: continue although a data file changed since the job's lineage recorded it; "
          "the change is recorded (also spelled --allow-data-change).");
ABSL_FLAG(std::string, db, "",
          "audit: read and check the audit log in this state database file offline (no daemon), "
          "e.g. /var/lib/megatrain/megatrain.db.");
ABSL_FLAG(double, nvme_rated_tbw, 0,
          "plan: the NVMe drive's rated endurance in TB (1e12 bytes; summed over a striped "
          "array): warn when the run writes more than --nvme_wear_warn_share of it; 0 = the "
          "daemon's nvme_rated_tbw_bytes.");
ABSL_FLAG(double, nvme_wear_warn_share, 0,
          "plan: share of the rated TBW one run may write before the plan warns; 0 = 0.1.");
ABSL_FLAG(uint32_t, devices, 0,
          "submit/plan: devices the job trains on, data parallel (JobSpec.devices; 0 = the "
          "spec's, 1 = one; with --hosts, per rank). The daemon refuses more than it drives.");
ABSL_FLAG(std::string, hosts, "",
          "submit/plan: the machines the job trains on as ranks the daemon launches through "
          "mpirun (JobSpec.hosts), comma-separated \"name\" or \"name:ranks\", e.g. "
          "node1:2,node2:2 (docs/scale_out.md \"Jobs on several machines\").");
ABSL_FLAG(std::optional<bool>, zero1, std::nullopt,
          "submit/plan: with --hosts, ZeRO-1 among the ranks (JobSpec.zero1); unset: the "
          "spec's, --zero1=false turns a spec's off.");
ABSL_FLAG(std::optional<bool>, speculative_update, std::nullopt,
          "submit/plan: set JobSpec.speculative_update: the optimizer update runs during the "
          "last micro-batch's backward, kept when the step is not clipped (with "
          "hyper.grad_clip_rule previous_norm: when the planned coefficient holds; needs the "
          "master, m and v all on NVMe with room for a second copy there, all in RAM with room "
          "for a second copy, 12 B/param, or the master in RAM with m and v on NVMe, with room for "
          "a second master in RAM and m/v regions on NVMe; docs/operations.md); "
          "unset: the spec's (default off).");
ABSL_FLAG(bool, scaling, false,
          "plan: in-process on the --hardware profile, predict tokens/s, TFLOP/s, scaling "
          "efficiency and bottleneck at 1, 2, 4, 8 devices, 2 and 4 nodes of 8, and --devices.");
ABSL_FLAG(std::string, hardware, "h100-sxm",
          "plan --scaling: the planner's hardware profile (h100-sxm, h100-pcie, h200, gh200, "
          "b200, a100-80gb, rtx4090, v100-32gb, h100-pcie-4nvme; docs/planning.md).");
ABSL_FLAG(std::string, daemon_config, "",
          "plan in-process: megatraind's config textproto whose device, budgets, roots and "
          "limits apply; empty = the defaults with / as the only root.");

namespace {

using namespace megatrain;
using client::ApplyWearFlags;
using client::ExitFor;
using client::PlanInProcess;
using client::PlanScaling;
using client::Print;
using client::SpecFromFlags;
using client::TerminalColumns;
using client::TerminalRows;
using client::Watch;

constexpr int kOk = client::kExitOk, kJobFailed = client::kExitFailed, kUsage = client::kExitUsage,
              kUnreachable = client::kExitUnreachable, kRejected = client::kExitRejected;

constexpr char kUsageText[] = R"(megatrain: talk to the megatraind training daemon.

Usage: megatrain <command> [args] [flags]

Commands:
  submit           Queue a job from --spec and/or flags; prints the job id.
                     megatrain submit --spec=job.json --steps=200 --watch
                     megatrain submit --model_config=builtin:tiny \
                       --text=/usr/share/games/fortunes/fortunes --steps=50
                   Unset hyperparameters take the daemon's defaults: --lr 3e-4 (cosine
                   decay, no warmup), --batch_size 8, --seq_len 256 (capped by the model);
                   --steps is required.
  list             List jobs, oldest first.        megatrain list --state=RUNNING,QUEUED
  purge            Remove jobs that ended more than --older_than_days ago from the daemon's
                   state (their audit rows and files stay); prints their ids.
                                                   megatrain purge --older_than_days=30
  status <id>      Show one job.                   megatrain status job-000001 --json
  watch <id>       Follow a job until it ends (a progress bar on a terminal, one line per
                   event otherwise); exit 1 if it failed or was cancelled.
                                                   megatrain watch job-000001
  cancel <id>      Cancel a queued or running job. megatrain cancel job-000001
  pause <id>       Checkpoint a running job, then release the device (returns while it
                   stops; the job becomes PAUSED); a queued job is paused at once.
                                                   megatrain pause job-000001
  resume <id>      Queue a paused job again; it continues from its last checkpoint. Refused
                   (the job stays PAUSED) when a data file changed since the job recorded
                   its hash, unless --allow-data-change (the change is then recorded in the
                   job's lineage and audit log).
                                                   megatrain resume job-000001
  checkpoint <id>  Checkpoint a running job now (waits up to 120 s) and print the path.
                                                   megatrain checkpoint job-000001 --json
  plan             Show parameters and bytes per buffer and tier for a spec, without running.
                   Asks the daemon; with --offline (or when no daemon answers) the engine
                   planner runs in-process (--daemon_config: the daemon's config to plan under)
                   and the output says so (stderr with --json).
                                                   megatrain plan --spec=job.json --offline
                   --scaling: the job on a --hardware profile (default h100-sxm) and its
                   predicted tokens/s, TFLOP/s, efficiency and bottleneck at 1, 2, 4, 8 devices
                   and over nodes (in-process; --devices=N adds a row).
                                                   megatrain plan --spec=job.json --scaling
  top              All jobs and the daemon at a glance, redrawn every --interval_seconds (2)
                   until Ctrl-C on a terminal; once into a pipe (--iterations=N: N screens).
                                                   megatrain top
  daemon-status    Version, device, health, memory, queue, the daemon's signing public key.
                                                   megatrain daemon-status --wait_seconds=10
  audit <id>       Print the job's audit log and check its hash chain; exit 1 naming the first
                   bad row when a row was altered or deleted. --db=FILE checks the state
                   database offline (no daemon).   megatrain audit job-000001 --db=/var/lib/megatrain/megatrain.db
  verify <dir>     Check checkpoints' files, signatures and provenance chain offline (no
                   daemon; exit 0 ok, 1 failed, 2 usage, 6 unsigned; `megatrain verify --help`).

Connection: --socket (default /run/megatrain/megatraind.sock), or --address=host:port with
--token_file and --ca_file for TCP (TLS + bearer token).
Exit codes: 0 ok, 1 watched job failed/cancelled or audit chain broken (verify: a mismatch),
2 usage (verify: also an I/O error), 3 daemon unreachable, 4 request rejected (the message
names the field), 5 no answer within the deadline (the request may still complete: a
checkpoint still being written; raise --timeout_seconds), 6 verify: matches but unsigned.)";

void SetDeadline(grpc::ClientContext& context, const std::string& command) {
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + client::CommandDeadline(command, absl::GetFlag(FLAGS_timeout_seconds))));
}

// Prints the audit log; exit 1 when its chain does not check.
int PrintAudit(const v1::AuditLog& log) {
  Print(absl::GetFlag(FLAGS_json) ? client::ToJson(log) : client::AuditText(log));
  if (!log.chain_ok()) {
    std::fprintf(stderr, "megatrain: audit chain broken at row %lld: %s\n",
                 static_cast<long long>(log.first_bad_row()), log.problem().c_str());
    return kJobFailed;
  }
  return kOk;
}

int Run(const std::string& command, const std::vector<std::string>& args) {
  const bool needs_id = command == "status" || command == "watch" || command == "cancel" ||
                        command == "pause" || command == "resume" || command == "checkpoint" ||
                        command == "audit";
  const bool known = needs_id || command == "submit" || command == "list" || command == "plan" ||
                     command == "daemon-status" || command == "purge" || command == "top";
  if (!known) {
    std::fprintf(stderr, "megatrain: unknown command '%s'\n\n%s\n", command.c_str(), kUsageText);
    return kUsage;
  }
  if (needs_id && args.size() != 1) {
    std::fprintf(stderr, "megatrain: '%s' takes exactly one job id\n", command.c_str());
    return kUsage;
  }
  if (!needs_id && !args.empty()) {
    std::fprintf(stderr, "megatrain: '%s' takes no positional arguments\n", command.c_str());
    return kUsage;
  }
  if (command == "plan" && absl::GetFlag(FLAGS_scaling)) return PlanScaling();
  if (command == "plan" && absl::GetFlag(FLAGS_offline)) return PlanInProcess("--offline");
  if (command == "audit" && !absl::GetFlag(FLAGS_db).empty()) {
    absl::StatusOr<std::vector<service::AuditRow>> rows =
        service::ReadAuditLogFile(absl::GetFlag(FLAGS_db), args[0]);
    if (!rows.ok()) {
      std::fprintf(stderr, "megatrain: %s\n", std::string(rows.status().message()).c_str());
      return kUsage;
    }
    if (rows->empty()) {
      std::fprintf(stderr, "megatrain: no audit rows for job '%s' in %s\n", args[0].c_str(),
                   absl::GetFlag(FLAGS_db).c_str());
      return kRejected;
    }
    return PrintAudit(service::CheckedAuditLog(*rows));
  }
  client::ConnectionOptions connection{absl::GetFlag(FLAGS_socket), absl::GetFlag(FLAGS_address),
                                       absl::GetFlag(FLAGS_token_file),
                                       absl::GetFlag(FLAGS_ca_file)};
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = client::Connect(connection);
  if (!channel.ok()) {
    std::fprintf(stderr, "megatrain: %s\n", std::string(channel.status().message()).c_str());
    return kUsage;
  }
  if (absl::GetFlag(FLAGS_wait_seconds) > 0 &&
      !(*channel)->WaitForConnected(std::chrono::system_clock::now() +
                                    std::chrono::seconds(absl::GetFlag(FLAGS_wait_seconds)))) {
    std::fprintf(stderr, "megatrain: daemon not reachable within %d s\n",
                 absl::GetFlag(FLAGS_wait_seconds));
    return kUnreachable;
  }
  std::unique_ptr<v1::Trainer::Stub> stub = v1::Trainer::NewStub(*channel);
  const bool json = absl::GetFlag(FLAGS_json);
  grpc::ClientContext context;
  SetDeadline(context, command);
  const std::string id = needs_id ? args[0] : "";

  if (command == "submit" || command == "plan") {
    absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
    if (!spec.ok()) {
      std::fprintf(stderr, "megatrain: %s\n", std::string(spec.status().message()).c_str());
      return kUsage;
    }
    if (command == "plan") {
      v1::PlanResponse plan;
      grpc::Status s = stub->Plan(&context, *spec, &plan);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        const std::string where = absl::GetFlag(FLAGS_address).empty()
                                      ? "unix:" + absl::GetFlag(FLAGS_socket)
                                      : absl::GetFlag(FLAGS_address);
        return PlanInProcess("no daemon answered at " + where);
      }
      if (!s.ok()) return ExitFor(s);
      if (absl::Status w = ApplyWearFlags(*spec, plan); !w.ok()) {
        std::fprintf(stderr, "megatrain: %s\n", std::string(w.message()).c_str());
        return kUsage;
      }
      Print(json ? client::ToJson(plan) : client::PlanText(plan));
      return kOk;
    }
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    v1::Job job;
    grpc::Status s = stub->SubmitJob(&context, request, &job);
    if (!s.ok()) return ExitFor(s);
    Print(json ? client::ToJson(job) : job.id());
    return absl::GetFlag(FLAGS_watch) ? Watch(*stub, job.id()) : kOk;
  }
  if (command == "top") {
    const bool tty = isatty(fileno(stdout)) != 0;
    const double interval = absl::GetFlag(FLAGS_interval_seconds);
    const int iterations = absl::GetFlag(FLAGS_iterations);
    if (!(interval > 0) || iterations < -1) {
      std::fprintf(stderr, "megatrain: top needs --interval_seconds > 0 and --iterations >= 0\n");
      return kUsage;
    }
    client::TopOptions top;
    top.interval = absl::Seconds(interval);
    top.iterations = iterations >= 0 ? iterations : tty ? 0 : 1;
    top.redraw = tty;
    top.columns = tty ? TerminalColumns() : 0;
    top.rows = tty ? TerminalRows() : 0;
    return client::RunTop(*stub, top);
  }
  if (command == "list") {
    v1::ListJobsRequest request;
    for (absl::string_view name :
         absl::StrSplit(absl::GetFlag(FLAGS_state), ',', absl::SkipEmpty())) {
      v1::JobState state;
      if (!v1::JobState_Parse(std::string(name), &state)) {
        std::fprintf(stderr, "megatrain: --state: '%s' is not a job state\n",
                     std::string(name).c_str());
        return kUsage;
      }
      request.add_states(state);
    }
    v1::ListJobsResponse response;  // every page, in order
    while (true) {
      grpc::ClientContext page_context;
      SetDeadline(page_context, command);
      v1::ListJobsResponse page;
      grpc::Status s = stub->ListJobs(&page_context, request, &page);
      if (!s.ok()) return ExitFor(s);
      for (v1::Job& job : *page.mutable_jobs()) *response.add_jobs() = std::move(job);
      if (page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
    if (json) {
      Print(client::ToJson(response));
    } else {
      for (const v1::Job& job : response.jobs()) Print(client::JobLine(job));
    }
    return kOk;
  }
  if (command == "purge") {
    const double days = absl::GetFlag(FLAGS_older_than_days);
    if (!(days > 0)) {
      std::fprintf(stderr, "megatrain: purge needs --older_than_days > 0\n");
      return kUsage;
    }
    v1::PurgeJobsRequest request;
    request.set_finished_before_unix_ms(
        absl::ToUnixMillis(absl::Now() - absl::Seconds(days * 86400.0)));
    v1::PurgeJobsResponse response;
    grpc::Status s = stub->PurgeJobs(&context, request, &response);
    if (!s.ok()) return ExitFor(s);
    if (json) {
      Print(client::ToJson(response));
    } else {
      for (const std::string& purged : response.purged_ids()) Print(purged);
    }
    return kOk;
  }
  if (command == "status") {
    v1::GetJobRequest request;
    request.set_id(id);
    v1::Job job;
    grpc::Status s = stub->GetJob(&context, request, &job);
    if (!s.ok()) return ExitFor(s);
    Print(json ? client::ToJson(job) : client::JobDetails(job));
    return kOk;
  }
  if (command == "watch") return Watch(*stub, id);
  v1::JobRef ref;
  ref.set_id(id);
  if (command == "audit") {
    v1::GetAuditLogRequest request;
    request.set_job_id(id);
    v1::AuditLog log;
    grpc::Status s = stub->GetAuditLog(&context, request, &log);
    if (!s.ok()) return ExitFor(s);
    return PrintAudit(log);
  }
  if (command == "cancel" || command == "pause" || command == "resume") {
    v1::ResumeJobRequest resume;
    resume.set_id(id);
    resume.set_allow_data_change(absl::GetFlag(FLAGS_allow_data_change));
    v1::Job job;
    grpc::Status s = command == "cancel"  ? stub->CancelJob(&context, ref, &job)
                     : command == "pause" ? stub->PauseJob(&context, ref, &job)
                                          : stub->ResumeJob(&context, resume, &job);
    if (!s.ok()) return ExitFor(s);
    Print(json ? client::ToJson(job) : client::JobLine(job));
    return kOk;
  }
  if (command == "checkpoint") {
    v1::CheckpointRecord record;
    grpc::Status s = stub->Checkpoint(&context, ref, &record);
    if (!s.ok()) return ExitFor(s);
    Print(json ? client::ToJson(record) : record.path());
    return kOk;
  }
  v1::DaemonStatus status;
  grpc::Status s = stub->GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status);
  if (!s.ok()) return ExitFor(s);
  Print(json ? client::ToJson(status) : client::DaemonStatusText(status));
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  // verify works offline and has its own flags: dispatched before flag parsing.
  if (argc >= 2 && std::string(argv[1]) == "verify") {
    return megatrain::client::RunVerifyCommand(std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(kUsageText);
  // The documented spelling of the allowance has dashes; absl flag names cannot.
  std::vector<std::string> renamed(argv, argv + argc);
  megatrain::client::SpellOutSpecSwitches(renamed);
  std::vector<char*> args;
  for (std::string& a : renamed) {
    if (a == "--allow-data-change") a = "--allow_data_change";
    args.push_back(a.data());
  }
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() < 2) {
    std::fprintf(stderr, "%s\n", kUsageText);
    return kUsage;
  }
  const std::string command = positional[1];
  if (command == "help") {
    std::printf("%s\n", kUsageText);
    return kOk;
  }
  return Run(command, std::vector<std::string>(positional.begin() + 2, positional.end()));
}
