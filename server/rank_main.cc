// megatrain_rank: one rank of a daemon job with JobSpec.hosts (docs/scale_out.md "Jobs on
// several machines"), launched by the daemon through mpirun. It validates the job as the daemon
// did (the spec and the daemon's settings from --job), trains its share with the other ranks, and
// tells the daemon through stdout, one JSON line per event (server/rank_protocol.h): rank 0 its
// progress, any rank its error. Signals mpirun forwards: SIGUSR1 = stop with a checkpoint (pause,
// shutdown), SIGUSR2 = checkpoint now. SIGTERM (a cancel: mpirun ends its ranks; or a peer died)
// keeps its default action: a rank waiting in a collective for a dead peer must not outlive it.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/device/device_options.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/signing_key.h"
#include "engine/train/rank_gpus.h"
#include "engine/train/training_run.h"
#include "proto/megatrain.pb.h"
#include "server/rank_protocol.h"
#include "server/signing_key_files.h"
#include "service/daemon_config.h"
#include "service/job_spec_validation.h"
#include "service/path_policy.h"

ABSL_FLAG(std::string, job, "", "The RankJob file the daemon wrote (binary protobuf).");
ABSL_FLAG(int, collective_timeout_s, 300,
          "Seconds a rank waits in one collective for the others before it ends the whole job "
          "naming itself (a rank that died or hangs); 0 = forever.");

namespace {

// Set by the signal handlers only; read between steps.
std::atomic<bool> g_pause{false};
std::atomic<bool> g_checkpoint{false};

void OnSignal(int sig) {
  if (sig == SIGUSR1) g_pause = true;
  if (sig == SIGUSR2) g_checkpoint = true;
}

// One whole line per write (mpirun forwards writes; the daemon reads lines).
void Emit(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(STDOUT_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Rank 0 speaks for the job; every rank hears the same signals, and RunTraining makes them
// agree on them before each step.
class RankObserver final : public megatrain::engine::TrainingObserver {
 public:
  RankObserver(bool speaks, uint64_t hold_after_step, int ranks)
      : speaks_(speaks), hold_after_step_(hold_after_step), ranks_(ranks) {}

  void OnLine(const std::string& line, bool keep) override {
    if (speaks_) Emit(megatrain::server::RankLineEvent(line, keep));
  }
  void OnStep(const megatrain::engine::StepReport& report, double validation_loss) override {
    if (speaks_) {
      // The job's step as one: every rank ran the same number of micro-batches of the same
      // shape, and the step's collectives end it on every rank together.
      megatrain::engine::StepReport job_step = report;
      job_step.tokens *= ranks_;
      job_step.tokens_per_second *= ranks_;
      Emit(megatrain::server::RankStepEvent(job_step, validation_loss));
    }
    if (first_step_ == 0) first_step_ = report.step;
    last_step_ = report.step;
  }
  bool ShouldStop() override {
    // The daemon's test hook (--test_hold_after_step): rank 0 waits before each step past the
    // hold for a request, the others for it in the ranks' agreement (a collective).
    if (speaks_ && hold_after_step_ != 0 && first_step_ != 0 && first_step_ <= hold_after_step_ &&
        last_step_ >= hold_after_step_) {
      while (!g_pause && !g_checkpoint) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return g_pause;
  }
  bool CheckpointBeforeStop() override { return true; }
  bool ShouldCheckpoint() override { return g_checkpoint.exchange(false); }
  void OnCheckpoint(uint64_t step, const std::string& path) override {
    if (speaks_) Emit(megatrain::server::RankCheckpointEvent(step, path));
  }

 private:
  const bool speaks_;
  const uint64_t hold_after_step_;
  const int ranks_;
  uint64_t first_step_ = 0;  // of this run (after a resume, the checkpoint's step + 1)
  uint64_t last_step_ = 0;
};

absl::StatusOr<megatrain::v1::RankJob> ReadRankJob(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--job: cannot read '", path, "'"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  megatrain::v1::RankJob job;
  if (!job.ParseFromString(bytes.str())) {
    return absl::InvalidArgumentError(absl::StrCat("--job: '", path, "' is not a RankJob"));
  }
  return job;
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
  if (!o.trainer.memory.budgets.nvme_dir.empty()) {
    // The NVMe tier's files have fixed names: ranks sharing a machine each get a directory.
    o.trainer.memory.budgets.nvme_dir += "/rank-" + std::to_string(mpi.rank());
    std::error_code ec;
    std::filesystem::create_directories(o.trainer.memory.budgets.nvme_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(absl::StrCat("memory.nvme_dir: cannot create ",
                                                      o.trainer.memory.budgets.nvme_dir, ": ",
                                                      ec.message()));
    }
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
  // Before anything slow: a signal forwarded early must not kill the rank.
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGUSR1, SIGUSR2}) sigaction(sig, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<v1::RankJob> rank_job = ReadRankJob(absl::GetFlag(FLAGS_job));
  if (!rank_job.ok()) {
    Emit(server::RankErrorEvent(-1, "", rank_job.status()));
    return 2;
  }
  engine::dist::MpiCommunicatorOptions mpi_options;
  mpi_options.collective_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_collective_timeout_s));
  absl::StatusOr<std::unique_ptr<engine::dist::MpiCommunicator>> mpi =
      engine::dist::MpiCommunicator::Create(mpi_options);
  if (!mpi.ok()) {
    Emit(server::RankErrorEvent(-1, "", mpi.status()));
    return 2;
  }
  engine::dist::MpiCommunicator& comm = **mpi;
  // A rank that cannot go on ends every rank: the others may wait for it in a collective.
  auto fail = [&](const absl::Status& status) {
    Emit(server::RankErrorEvent(comm.rank(), comm.host(), status));
    comm.Abort(1);
    return 1;
  };
  absl::StatusOr<service::ValidatedJob> job = RankRun(*rank_job, comm);
  if (!job.ok()) return fail(job.status());
  RankObserver observer(comm.rank() == 0, rank_job->test_hold_after_step(), comm.size());
  absl::StatusOr<engine::TrainingRunResult> result =
      engine::RunTraining(job->model, job->options, observer);
  if (absl::IsCancelled(result.status())) {
    if (comm.rank() == 0) Emit(server::RankStoppedEvent(std::string(result.status().message())));
    return 0;
  }
  if (!result.ok()) return fail(result.status());
  if (comm.rank() == 0) Emit(server::RankResultEvent(*result));
  return 0;
}
