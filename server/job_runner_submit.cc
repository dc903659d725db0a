// JobRunner::Submit: a new job checked against the daemon's state (health, queue length, an
// output directory no other job uses), recorded in the store and queued (protocol 1 in
// job_runner.h).
#include "server/job_runner.h"

#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "server/job_runner_internal.h"
#include "service/path_policy.h"

namespace megatrain::server {

using job_runner_internal::IsTerminal;
using job_runner_internal::NowMs;

absl::StatusOr<v1::Job> JobRunner::Submit(const v1::JobSpec& spec, service::ValidatedJob job,
                                          std::optional<uint32_t> submitter_uid) {
  // Read before taking mu_ (protocol 8): checkpoints already in the directory that no known job
  // owns (a purged job's, another state directory's) would be resumed from and pruned.
  bool holds_checkpoints = false;
  if (!job.output_dir.empty() && !spec.reuse_output_dir()) {
    absl::StatusOr<std::vector<engine::CheckpointListing>> found =
        engine::ListCheckpoints(job.output_dir + "/checkpoints");
    holds_checkpoints = found.ok() && !found->empty();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("megatraind is shutting down");
  if (!healthy_) {
    return absl::FailedPreconditionError(absl::StrCat("daemon unhealthy (", unhealthy_reason_,
                                                      "); restart megatraind to take new jobs"));
  }
  if (queue_.size() >= max_queue_length_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue already holds ", queue_.size(), " jobs (max_queue_length)"));
  }
  if (absl::Status s = CheckOutputDirFreeLocked(spec, job); !s.ok()) return s;
  if (holds_checkpoints) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output_dir: '", spec.output_dir(), "' already holds checkpoints (", job.output_dir,
        "/checkpoints) of a job this daemon no longer knows (purged, or of another state "
        "directory); to write into it anyway set reuse_output_dir (megatrain submit "
        "--reuse_output_dir): this job's checkpoints then go to its own directory there"));
  }
  const int64_t sequence = next_sequence_++;
  const std::string id = absl::StrFormat("job-%06d", sequence);
  v1::Job record;
  record.set_id(id);
  *record.mutable_spec() = spec;
  record.set_submitted_unix_ms(NowMs());
  record.mutable_progress()->set_total_steps(spec.hyper().steps());
  record.mutable_progress()->set_validation_loss(std::numeric_limits<double>::quiet_NaN());
  if (!job.output_dir.empty()) record.set_resolved_output_dir(job.output_dir);
  record.set_state(v1::QUEUED);
  if (submitter_uid.has_value()) record.set_submitter_uid(*submitter_uid);
  // Persisted before it is visible (protocol 1): a job the database lacks is never queued.
  if (absl::Status s = writer_.InsertJob(sequence, record); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("state database: job not recorded, so not queued: ", s.message(),
                     "; megatraind takes no jobs until it is restarted"));
  }
  Entry& e = jobs_[id];
  e.sequence = sequence;
  e.job = SharedJob(std::move(record));
  e.validated = std::move(job);
  queue_.push_back(id);
  TransitionLocked(e, v1::QUEUED, "submitted", "submit");
  return *e.job;
}

absl::Status JobRunner::CheckOutputDirFreeLocked(const v1::JobSpec& spec,
                                                 const service::ValidatedJob& job) const {
  // A job's checkpoints live under its output directory and a run resumes from the newest one
  // there, so two jobs must not share it: compared by the resolved path (jobs stored before it
  // was recorded: the spec's path, normalized), so aliases match also after a restart.
  if (job.output_dir.empty()) return absl::OkStatus();
  for (const auto& [other_id, other] : jobs_) {
    const std::string other_dir =
        !other.job->resolved_output_dir().empty() ? other.job->resolved_output_dir()
        : other.job->spec().output_dir().empty()
            ? std::string()
            : service::NormalizeAbsolutePath(other.job->spec().output_dir());
    if (other_dir != job.output_dir) continue;
    const bool ended = IsTerminal(other.job->state());
    if (ended && spec.reuse_output_dir()) continue;
    if (ended) {
      return absl::FailedPreconditionError(absl::StrCat(
          "output_dir: '", spec.output_dir(), "' is '", job.output_dir, "', the directory of job '",
          other_id, "' (", JobStateName(other.job->state()),
          "); to write into it anyway set reuse_output_dir (megatrain submit "
          "--reuse_output_dir): this job's checkpoints then go to its own directory there"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir: '", spec.output_dir(), "' is '", job.output_dir,
                     "', already used by job '", other_id, "' (", JobStateName(other.job->state()),
                     "); each job needs its own (it holds the job's checkpoints)"));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::server
