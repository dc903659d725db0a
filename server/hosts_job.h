// RunJobOverHosts: a job with JobSpec.hosts, run as the ranks of one MPI job that the daemon
// launches (mpirun --host ...) and supervises: rank 0's progress reaches the runner's observer
// as if the job ran in the daemon's process; a pause, a shutdown or a checkpoint request reaches
// every rank as a signal mpirun forwards (the ranks agree on it before their next step); a cancel
// ends mpirun and with it every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/train/training_run.h"
#include "proto/megatrain.pb.h"
#include "service/validated_job.h"

namespace megatrain::server {

// What the daemon launches with: its configuration (handed to every rank) and the flags-only
// settings the ranks must share.
struct HostsLaunch {
  v1::DaemonConfig daemon_config;  // the daemon's, after its flags
  uint64_t max_ram_bytes = 0;      // megatraind --max_ram_bytes
  uint64_t test_hold_after_step = 0;
  // How long a cancelled launcher has to end its ranks (SIGTERM) before it and its process group
  // get SIGKILL.
  int cancel_grace_seconds = 30;
};

// The launcher's argv for `job` with its rank job file at `rank_job_path`: [setpriv
// --pdeathsig TERM --] mpirun [mpirun_args] [-x OPENBLAS_CORETYPE, when the daemon has it set]
// --host a:2,b:1 -np 3 megatrain_rank --job=FILE --job_sha256=HEX. setpriv (util-linux) ends mpirun
// with the daemon, so a daemon that dies leaves no ranks training behind the restarted daemon's
// relaunch. FAILED_PRECONDITION naming what is missing.
absl::StatusOr<std::vector<std::string>> HostsLauncherArgv(const HostsLaunch& launch,
                                                           const service::ValidatedJob& job,
                                                           const std::string& rank_job_path,
                                                           const std::string& rank_job_sha256);

// Runs `job` over its hosts to the end. `prepared` is the job's options after the daemon's data
// preparation (token files, chat samples), with its checkpoint directory (made). OK after
// rank 0's result (result.json written), CANCELLED after a requested stop, else the first error a
// rank reported (naming the rank and its host) or the launcher's own words: a plain failure for
// a rank's verdict on the job itself (a bad field, a missing file, no memory), else a
// ResumableFailure (a rank died or hung, the launch failed, a collective failed).
// The RankJob goes to <checkpoint_dir>/rank_job.binpb (the ranks resume from that directory, so
// they share it).
absl::Status RunJobOverHosts(const std::string& job_id, const service::ValidatedJob& job,
                             const engine::TrainingRunOptions& prepared, const HostsLaunch& launch,
                             engine::TrainingObserver& observer);

}  // namespace megatrain::server
