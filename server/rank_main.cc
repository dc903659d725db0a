// megatrain_rank: one rank of a daemon job with JobSpec.hosts (docs/scale_out.md "Jobs on
// several machines"), launched by the daemon through mpirun. It validates the job as the daemon
// did (the spec and the daemon's settings from --job), trains its share with the other ranks, and
// tells the daemon through stdout, one JSON line per event (server/rank_protocol.h): rank 0 its
// progress, any rank its error. Signals mpirun forwards: SIGUSR1 = stop with a checkpoint (pause,
// shutdown), SIGUSR2 = checkpoint now. SIGTERM (a cancel: mpirun ends its ranks; or a peer died)
// keeps its default action: a rank waiting in a collective for a dead peer must not outlive it.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"
#include "engine/common/status_macros.h"
#include "engine/device/device_options.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/sha256.h"
#include "engine/provenance/signing_key.h"
#include "engine/tiers/nvme_tier_files.h"
#include "engine/train/rank_gpus.h"
#include "engine/train/training_run.h"
#include "kernels/cpu/blas_kernels.h"
#include "proto/megatrain.pb.h"
#include "server/rank_observer.h"
#include "server/rank_protocol.h"
#include "server/signing_key_files.h"
#include "service/daemon_config.h"
#include "service/job_spec_validation.h"
#include "service/path_policy.h"

ABSL_FLAG(std::string, job, "", "The RankJob file the daemon wrote (binary protobuf).");
ABSL_FLAG(std::string, job_sha256, "", "The SHA-256 of --job's bytes, as the daemon wrote them.");
ABSL_FLAG(int, collective_timeout_s, 300,
          "Seconds a rank waits in one collective for the others before it ends the whole job "
          "naming itself (a rank that died or hangs); 0 = forever.");

namespace {

// Written by the signal handlers only (lock-free atomics), read between steps.
megatrain::server::RankRequests g_requests;

void OnSignal(int sig) {
  if (sig == SIGUSR1) g_requests.pause = true;
  if (sig == SIGUSR2) g_requests.checkpoint = true;
}

// This machine's name, for errors before MPI names the rank.
std::string ThisHost() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

// The RankJob at `path`, whose bytes must hash to `sha256` (given in argv by the daemon, so a
// file swapped on the shared file system is refused, never trusted with the daemon's roots).
absl::StatusOr<megatrain::v1::RankJob> ReadRankJob(const std::string& path,
                                                   const std::string& sha256) {
  absl::StatusOr<std::string> bytes = megatrain::engine::ReadRegularFile(path, size_t{256} << 20);
  if (!bytes.ok()) return bytes.status();
  megatrain::provenance::Sha256 hash;
  hash.Update(std::string_view(*bytes));
  if (hash.FinalHex() != sha256) {
    return absl::PermissionDeniedError(
        absl::StrCat("--job: '", path, "' is not the file the daemon wrote (its SHA-256 differs)"));
  }
  megatrain::v1::RankJob job;
  if (!job.ParseFromString(*bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("--job: '", path, "' is not a RankJob"));
  }
  return job;
}

// <nvme_dir>/rank-N, this rank's NVMe directory (ranks sharing a machine each need their own:
// the tier's files have fixed names): created 0700, or reused only when it is a directory (not a
// symlink) of this user that nobody else may write.
absl::StatusOr<std::string> RankNvmeDirectory(const std::string& nvme_dir, int rank) {
  const std::string dir = megatrain::engine::tiers::RankTierDirectory(nvme_dir, rank);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("memory.nvme_dir: cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 022) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "memory.nvme_dir: ", dir,
        " is not a directory of this user that only it may write (a symlink, another user's, or "
        "writable by its group or others)"));
  }
  return dir;
}

// The job as this rank runs it: validated as the daemon validated it, on the daemon's data
// preparation, checkpoints and lineage, with the ranks' communicator.
absl::StatusOr<megatrain::service::ValidatedJob> RankRun(
    const megatrain::v1::RankJob& rank_job, megatrain::engine::dist::MpiCommunicator& mpi) {
  using namespace megatrain;
  absl::StatusOr<service::DaemonSettings> settings =
      service::ValidateDaemonConfig(rank_job.daemon());
  if (!settings.ok()) return settings.status();
  settings->max_ram_bytes = rank_job.max_ram_bytes();
  // This machine's host-memory check counts its own ranks, not the busiest machine's.
  settings->ranks_on_this_machine = mpi.local_size();
  settings->rank = mpi.rank();
  const service::PathPolicy paths(settings->data_roots, settings->output_roots);
  absl::StatusOr<service::ValidatedJob> job =
      service::ValidateJobSpec(rank_job.spec(), *settings, paths);
  if (!job.ok()) return job.status();
  if (job->ranks != mpi.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job names ", job->ranks, " ranks; mpirun started ", mpi.size()));
  }
  engine::TrainingRunOptions& o = job->options;
  if (rank_job.token_files_size() > 0) {
    // As the daemon runs it: the text's identity (text_paths kept), read from the token file.
    o.token_files.assign(rank_job.token_files().begin(), rank_job.token_files().end());
    o.token_format = rank_job.token_format();
    if (rank_job.has_tokenized_text_documents()) {
      o.tokenized_text_documents = rank_job.tokenized_text_documents();
    }
  }
  if (rank_job.sft_sample_paths_size() > 0) {
    o.sft_sample_paths.assign(rank_job.sft_sample_paths().begin(),
                              rank_job.sft_sample_paths().end());
  }
  if (!rank_job.lineage_json().empty()) {
    absl::StatusOr<provenance::Lineage> lineage =
        provenance::ParseLineage(rank_job.lineage_json(), "rank job lineage");
    if (!lineage.ok()) return lineage.status();
    o.lineage = *std::move(lineage);
  }
  // Signed with the daemon's key where this machine holds it (the daemon's own), unsigned
  // elsewhere rather than with a key nobody trusts.
  const std::string key_path = absl::StrCat(settings->state_dir, "/", server::kSigningKeyFileName);
  if (access(key_path.c_str(), R_OK) == 0) {
    absl::StatusOr<provenance::SigningKey> key = provenance::SigningKey::Load(key_path);
    if (!key.ok()) return key.status();
    o.signer = std::make_shared<const provenance::SigningKey>(*std::move(key));
  }
  o.checkpoint_dir = rank_job.checkpoint_dir();
  o.resume = true;
  o.trainer.communicator = &mpi;
  o.agree_on_requests = true;
  // The same deadline for the GPUs' NCCL reduce-scatter as for MPI's collectives (0 = none).
  o.trainer.collective_timeout = absl::GetFlag(FLAGS_collective_timeout_s) == 0
                                     ? absl::InfiniteDuration()
                                     : absl::Seconds(absl::GetFlag(FLAGS_collective_timeout_s));

  if (!o.trainer.memory.budgets.nvme_dir.empty()) {
    absl::StatusOr<std::string> dir =
        RankNvmeDirectory(o.trainer.memory.budgets.nvme_dir, mpi.rank());
    if (!dir.ok()) return dir.status();
    o.trainer.memory.budgets.nvme_dir = *dir;
  }
  if (o.device.kind == engine::DeviceKind::kCuda) {
    MT_RETURN_IF_ERROR(
        engine::ChooseRankGpus(mpi, /*choose=*/true, o.devices, o.device.cuda_device_ordinal));
  }
  return job;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "megatrain_rank --job=FILE: a rank of a daemon job on several machines, started by the "
      "daemon through mpirun (docs/scale_out.md); not for direct use.");
  absl::ParseCommandLine(argc, argv);
  using namespace megatrain;
  // Before anything slow: a signal forwarded early must not kill the rank. SA_RESTART: a request
  // arriving during a write or a read does not interrupt it.
  struct sigaction action {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGUSR1, SIGUSR2}) sigaction(sig, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<v1::RankJob> rank_job =
      ReadRankJob(absl::GetFlag(FLAGS_job), absl::GetFlag(FLAGS_job_sha256));
  if (!rank_job.ok()) {
    server::EmitLine(server::RankErrorEvent(-1, ThisHost(), rank_job.status()));
    return 2;
  }
  engine::dist::MpiCommunicatorOptions mpi_options;
  mpi_options.collective_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_collective_timeout_s));
  absl::StatusOr<std::unique_ptr<engine::dist::MpiCommunicator>> mpi =
      engine::dist::MpiCommunicator::Create(mpi_options);
  if (!mpi.ok()) {
    server::EmitLine(server::RankErrorEvent(-1, ThisHost(), mpi.status()));
    return 2;
  }
  engine::dist::MpiCommunicator& comm = **mpi;
  if (comm.rank() == 0) {
    // Past MPI's start every rank has its handlers: the daemon may now send its requests.
    server::EmitLine(server::RankLineEvent(
        absl::StrCat(comm.size(), " ranks joined (rank 0 on ", comm.host(), ")"), true));
  }
  // A rank that cannot go on ends every rank: the others may wait for it in a collective.
  auto fail = [&](const absl::Status& status) {
    server::EmitLine(server::RankErrorEvent(comm.rank(), comm.host(), status));
    comm.Abort(1);
  };
  // Once per machine: the daemon's own warning speaks for its machine only (docs/operations.md,
  // "OpenBLAS kernels").
  if (const std::string blas = kernels::cpu::SlowBlasKernelsWarning();
      !blas.empty() && comm.local_rank() == 0) {
    server::EmitLine(server::RankLineEvent(absl::StrCat(comm.host(), ": ", blas), true));
  }
  absl::StatusOr<service::ValidatedJob> job = RankRun(*rank_job, comm);
  if (!job.ok()) {
    fail(job.status());
    return 1;
  }
  server::RankObserver observer(g_requests, comm.rank() == 0, comm.size(),
                                rank_job->test_hold_after_step());
  absl::StatusOr<engine::TrainingRunResult> result =
      engine::RunTraining(job->model, job->options, observer);
  if (absl::IsCancelled(result.status())) {
    observer.OnStopped(std::string(result.status().message()));
    return 0;
  }
  if (!result.ok()) {
    fail(result.status());
    return 1;
  }
  observer.OnResult(*result);
  return 0;
}
