// RunJobOverHosts (see hosts_job.h).
#include "server/hosts_job.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/common/safe_files.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/sha256.h"
#include "server/child_process.h"
#include "server/job_result.h"
#include "server/rank_protocol.h"
#include "server/resumable_failure.h"
#include "service/hosts_spec_validation.h"

namespace megatrain::server {
namespace {

constexpr char kRankJobFileName[] = "rank_job.binpb";
constexpr char kSetpriv[] = "/usr/bin/setpriv";

// `name` itself when it has a '/', else the first executable of that name on PATH; "" if none.
std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A rank's error that names the job itself, not the moment: its fields, its files, its memory.
bool WouldFailAgain(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
      return true;
    default:
      return false;
  }
}

// What mpirun said on stderr, without its rules of dashes and its notes of forwarded signals
// (the daemon's own pause and checkpoint requests): lines joined by " | ".
std::string LauncherWords(const std::string& err) {
  std::string words;
  for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipWhitespace())) {
    if (absl::StartsWith(line, "mpirun: Forwarding signal") ||
        line.find_first_not_of('-') == absl::string_view::npos) {
      continue;
    }
    absl::StrAppend(&words, words.empty() ? "" : " | ", absl::StripAsciiWhitespace(line));
  }
  return words;
}

v1::RankJob MakeRankJob(const std::string& job_id, const service::ValidatedJob& job,
                        const engine::TrainingRunOptions& prepared, const HostsLaunch& launch) {
  v1::RankJob r;
  r.set_job_id(job_id);
  *r.mutable_spec() = job.spec;
  *r.mutable_daemon() = launch.daemon_config;
  // The ranks listen on nothing: the daemon's listeners and their secrets stay with it.
  v1::DaemonConfig& d = *r.mutable_daemon();
  d.clear_tcp_address();
  d.clear_tls_cert_file();
  d.clear_tls_key_file();
  d.clear_token_file();
  d.clear_metrics_address();
  d.clear_metrics_exposed();
  d.clear_dashboard_host_names();
  r.set_max_ram_bytes(launch.max_ram_bytes);
  r.set_checkpoint_dir(prepared.checkpoint_dir);
  for (const std::string& f : prepared.token_files) r.add_token_files(f);
  r.set_token_format(prepared.token_format);
  if (prepared.tokenized_text_documents.has_value()) {
    r.set_tokenized_text_documents(*prepared.tokenized_text_documents);
  }
  for (const std::string& f : prepared.sft_sample_paths) r.add_sft_sample_paths(f);
  if (job.options.lineage.has_value()) {
    r.set_lineage_json(provenance::LineageToJson(*job.options.lineage));
  }
  r.set_test_hold_after_step(launch.test_hold_after_step);
  return r;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> HostsLauncherArgv(const HostsLaunch& launch,
                                                           const service::ValidatedJob& job,
                                                           const std::string& rank_job_path,
                                                           const std::string& rank_job_sha256) {
  const v1::DaemonConfig& c = launch.daemon_config;
  const std::string mpirun =
      FindExecutable(c.mpirun_binary().empty() ? "mpirun" : c.mpirun_binary());
  if (mpirun.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hosts: no launcher: mpirun_binary '",
        c.mpirun_binary().empty() ? "mpirun" : c.mpirun_binary(),
        "' is not an executable (on PATH); install Open MPI (scripts/setup) or set mpirun_binary"));
  }
  const std::string rank_binary =
      c.rank_binary().empty() ? BesideThisExecutable("megatrain_rank") : c.rank_binary();
  if (access(rank_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("hosts: rank_binary '", rank_binary,
                                                      "' is not an executable on this machine"));
  }
  std::vector<std::string> argv;
  if (access(kSetpriv, X_OK) == 0) argv = {kSetpriv, "--pdeathsig", "TERM", "--"};
  argv.push_back(mpirun);
  for (const std::string& a : c.mpirun_args()) argv.push_back(a);
  // The daemon's OpenBLAS kernel set (docs/operations.md "OpenBLAS kernels") for every rank: the
  // same set on every machine, so CPU-device ranks compute the bits of one process.
  if (const char* blas = std::getenv("OPENBLAS_CORETYPE"); blas != nullptr && *blas != '\0') {
    argv.push_back("-x");
    argv.push_back("OPENBLAS_CORETYPE");
  }
  for (const std::string& a :
       {std::string("--host"), service::MpirunHostList(job.hosts), std::string("-np"),
        absl::StrCat(job.ranks), rank_binary, absl::StrCat("--job=", rank_job_path),
        absl::StrCat("--job_sha256=", rank_job_sha256)}) {
    argv.push_back(a);
  }
  return argv;
}

absl::Status RunJobOverHosts(const std::string& job_id, const service::ValidatedJob& job,
                             const engine::TrainingRunOptions& prepared, const HostsLaunch& launch,
                             engine::TrainingObserver& observer) {
  // Beside the checkpoints, which every rank reads on resume, so on the file system they share;
  // its hash travels in mpirun's argv, so a rank trusts no other file under that name.
  const std::string& checkpoint_dir = prepared.checkpoint_dir;
  const std::string rank_job = MakeRankJob(job_id, job, prepared, launch).SerializeAsString();
  // Never through a symlink planted in the directory (issue 16, point 1).
  if (absl::Status s = engine::WriteFileInDirectory(checkpoint_dir, kRankJobFileName, rank_job);
      !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("rank job file: ", s.message()));
  }
  provenance::Sha256 hash;
  hash.Update(std::string_view(rank_job));
  absl::StatusOr<std::vector<std::string>> argv = HostsLauncherArgv(
      launch, job, absl::StrCat(checkpoint_dir, "/", kRankJobFileName), hash.FinalHex());
  if (!argv.ok()) return argv.status();
  std::string hosts;
  for (const service::RankHost& h : job.hosts) {
    absl::StrAppend(&hosts, hosts.empty() ? "" : ", ", h.name, " (", h.ranks, ")");
  }
  if ((*argv)[0] != kSetpriv) {
    observer.OnLine(absl::StrCat(kSetpriv,
                                 " is missing (util-linux): if this daemon dies, the "
                                 "job's ranks run on until they end"),
                    true);
  }
  observer.OnLine(
      absl::StrCat("launching ", job.ranks, " ranks on ", hosts, ": ", absl::StrJoin(*argv, " ")),
      true);

  RankEvents events(observer);
  ChildOptions options;
  options.on_stdout_line = [&events](const std::string& line) { events.OnOutputLine(line); };
  options.max_output_bytes = size_t{1} << 20;  // a rank's longest error line, whole
  options.keep_tail = true;                    // mpirun's last words say why it ended
  options.stop_grace = absl::Seconds(launch.cancel_grace_seconds);
  // A pause or a daemon shutdown: every rank checkpoints and stops (mpirun forwards SIGUSR1);
  // a checkpoint request: every rank checkpoints the step it is at (SIGUSR2). Only once rank 0
  // spoke: before, a rank may not have its handlers yet (the signal would end it); the requests
  // wait. A cancel keeps nothing: should_stop below ends mpirun, which ends the ranks.
  bool stop_sent = false;
  options.signal_to_send = [&]() -> int {
    if (!events.started()) return 0;
    if (!stop_sent && observer.ShouldStop() && observer.CheckpointBeforeStop()) {
      stop_sent = true;
      return SIGUSR1;
    }
    return observer.ShouldCheckpoint() ? SIGUSR2 : 0;
  };
  absl::StatusOr<ChildResult> child = RunChildProcess(
      *argv,
      [&] {
        // A stop before the ranks started has nothing to keep: end the launch.
        return observer.ShouldStop() && (!observer.CheckpointBeforeStop() || !events.started());
      },
      options);
  if (!child.ok()) return child.status();
  if (events.result().has_value() && child->exit_code == 0) {
    return WriteJobResult(job_id, job, *events.result(), engine::RunDataIsText(prepared));
  }
  if (events.first_error().has_value()) {
    // A rank's own verdict on the job (its spec, data or memory on that machine) would be the
    // same again; anything else (a collective that failed under a dead peer, an I/O error) may
    // not: the job keeps its checkpoints and waits for a resume.
    return WouldFailAgain(*events.first_error()) ? *events.first_error()
                                                 : ResumableFailure(*events.first_error());
  }
  if (events.stopped().has_value() && child->exit_code == 0) {
    return absl::CancelledError(*events.stopped());
  }
  std::string said = LauncherWords(child->err);
  if (said.size() > 2000) said = "..." + said.substr(said.size() - 2000);
  // The ranks' own reports (the collective watchdog's "error: rank N of W on host H: ...") come
  // first: Open MPI's abort banners after them can fill any tail.
  std::string reports;
  for (absl::string_view line : absl::StrSplit(child->err, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::StartsWith(line, "error: rank ") || reports.size() > 4000) continue;
    if (absl::StrContains(said, line)) continue;  // already in the tail below
    absl::StrAppend(&reports, reports.empty() ? "" : " | ", line.substr(0, 1000));
  }
  if (!reports.empty()) said = absl::StrCat(reports, said.empty() ? "" : " || ", said);
  const absl::Status ended = absl::UnavailableError(
      absl::StrCat("the job's ranks ended without a result: mpirun",
                   child->term_signal != 0 ? absl::StrCat(" killed by signal ", child->term_signal)
                                           : absl::StrCat(" exited with code ", child->exit_code),
                   said.empty() ? "" : ": ", said));
  // A rank that died or hung (the watchdog's MPI_Abort) ended every rank, or the launch failed
  // (ssh refused, a host down): the job continues from its last checkpoint when resumed, never
  // lost to a passing fault; mpirun's words say what to mend first if it fails again.
  return ResumableFailure(ended);
}

}  // namespace megatrain::server
