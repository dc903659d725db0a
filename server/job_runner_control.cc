// JobRunner's control of existing jobs: cancel, pause, resume (with its data check, protocol 6),
// checkpoint now, and purging ended jobs.
#include "server/job_runner.h"

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "server/job_lineage.h"
#include "server/job_runner_internal.h"

namespace megatrain::server {

using job_runner_internal::CheckpointNote;
using job_runner_internal::IsTerminal;
using job_runner_internal::NowMs;

absl::StatusOr<std::vector<std::string>> JobRunner::Purge(int64_t finished_before_unix_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> purged;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const v1::Job& job = *it->second.job;
    if (!IsTerminal(job.state()) || job.finished_unix_ms() >= finished_before_unix_ms) {
      ++it;
      continue;
    }
    if (absl::Status s = writer_.PurgeJob(it->first, it->second.sequence); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("purging job '", it->first, "': ", s.message(),
                                                 "; purged before it: ", purged.size()));
    }
    AuditLocked(it->first, "purged",
                absl::StrCat("removed from the daemon's state (", JobStateName(job.state()),
                             ", finished ", job.finished_unix_ms(), ")"));
    purged.push_back(it->first);
    histories_.Remove(it->first);
    it = jobs_.erase(it);
  }
  log_.Event("jobs_purged", {{"count", absl::StrCat(purged.size())},
                             {"finished_before_unix_ms", absl::StrCat(finished_before_unix_ms)}});
  PublishCountsLocked();
  NotifyChangedLocked();  // watchers of a purged job find it gone
  return purged;
}

absl::StatusOr<v1::Job> JobRunner::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  Entry& e = it->second;
  if (IsTerminal(e.job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' already ended as ", JobStateName(e.job->state())));
  }
  if (id == running_) {
    cancel_running_ = true;
    e.message = "cancel requested";
    ++e.version;
    NotifyChangedLocked();
    log_.JobEvent("cancel_requested", id);
    return *e.job;
  }
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  e.job.Mutable().set_finished_unix_ms(NowMs());
  TransitionLocked(e, v1::CANCELLED, "cancelled while queued", "cancel");
  return *e.job;
}

absl::StatusOr<v1::Job> JobRunner::Pause(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  Entry& e = it->second;
  if (id == running_) {
    if (cancel_running_) {
      return absl::FailedPreconditionError(absl::StrCat("job '", id, "' is being cancelled"));
    }
    pause_running_ = true;
    e.message = "pause requested: checkpoint, then stop";
    ++e.version;
    NotifyChangedLocked();
    log_.JobEvent("pause_requested", id);
    return *e.job;
  }
  if (e.job->state() != v1::QUEUED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id, "' is ", JobStateName(e.job->state()), "; only QUEUED or RUNNING jobs pause"));
  }
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  TransitionLocked(e, v1::PAUSED, "paused while queued", "pause");
  return *e.job;
}

absl::StatusOr<v1::Job> JobRunner::Resume(const std::string& id, bool allow_data_change) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  Entry* entry = &it->second;
  // Looked up again after each unlocked phase: the job may have been cancelled and purged.
  auto check_paused = [&]() -> absl::Status {
    if (stopping_) return absl::UnavailableError("megatraind is shutting down");
    auto found = jobs_.find(id);
    if (found == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
    }
    entry = &found->second;
    const Entry& e = *entry;
    if (e.job->state() != v1::PAUSED) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id, "' is ", JobStateName(e.job->state()), ", not PAUSED"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_paused(); !s.ok()) return s;
  if (!entry->validated.has_value()) {  // paused before a restart: check today's files and limits
    const v1::JobSpec spec = entry->job->spec();
    lock.unlock();
    absl::StatusOr<service::ValidatedJob> validated = revalidate_(spec);
    lock.lock();
    if (absl::Status s = check_paused(); !s.ok()) return s;
    if (!validated.ok()) {
      return absl::Status(validated.status().code(),
                          absl::StrCat("re-validation: ", validated.status().message()));
    }
    if (!entry->validated.has_value()) entry->validated = std::move(*validated);
  }
  if (entry->lineage.has_value()) {  // protocol 6's data check, answered to the caller at once
    const provenance::Lineage lineage = *entry->lineage;
    const service::ValidatedJob validated = *entry->validated;
    lock.unlock();
    absl::StatusOr<std::vector<provenance::InputFile>> current = HashDataInputs(validated);
    lock.lock();
    if (absl::Status s = check_paused(); !s.ok()) return s;
    if (!current.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id, "': data check: ", current.status().message()));
    }
    const std::vector<provenance::DataChange> changes = CompareDataInputs(lineage, *current);
    if (!changes.empty() && !allow_data_change) {
      const std::string message = absl::StrCat(
          "job '", id, "' stays PAUSED: ", DescribeDataChanges(changes),
          ". Restore the data, or continue with it: megatrain resume ", id,
          " --allow-data-change (the change is then recorded in the job's lineage and audit "
          "log)");
      AuditLocked(id, "data_change_refused", message);
      log_.JobEvent("data_change_refused", id, {{"message", message}});
      return absl::FailedPreconditionError(message);
    }
  }
  Entry& e = *entry;
  e.allow_data_change = allow_data_change;
  e.job.Mutable().clear_failure_reason();
  queue_.push_back(id);
  TransitionLocked(e, v1::QUEUED,
                   absl::StrCat("resumed; it continues ", CheckpointNote(*e.job),
                                allow_data_change ? " (data changes allowed)" : ""),
                   "resume");
  return *e.job;
}

absl::StatusOr<v1::CheckpointRecord> JobRunner::CheckpointNow(const std::string& id,
                                                              absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  Entry& e = it->second;
  if (id != running_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id, "' is ", JobStateName(e.job->state()), "; only a RUNNING job checkpoints"));
  }
  const uint64_t from_step = e.job->progress().step();
  const uint64_t committed_before = e.checkpoints_committed;
  checkpoint_request_step_ = from_step;
  checkpoint_requested_ = true;
  log_.JobEvent("checkpoint_requested", id, {{"after_step", absl::StrCat(from_step)}});
  ++checkpoint_waiters_;
  NotifyChangedLocked();  // a held run (test hook) steps on until the checkpoint is committed
  // The entry stays while the job runs; once it ended it is looked up again (PurgeJobs).
  auto answered = [&] {
    return running_ == id && e.checkpoints_committed > committed_before &&
           e.last_checkpoint.step() >= from_step;
  };
  changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                    [&] { return answered() || running_ != id || stopping_; });
  --checkpoint_waiters_;
  if (answered()) return e.last_checkpoint;
  if (running_ != id) {
    const Entry* ended = FindLocked(id);
    if (ended != nullptr && ended->checkpoints_committed > committed_before &&
        ended->last_checkpoint.step() >= from_step) {
      return ended->last_checkpoint;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id, "' stopped as ",
        ended == nullptr ? std::string("a purged job") : JobStateName(ended->job->state()),
        " before the checkpoint was written"));
  }
  if (stopping_) return absl::UnavailableError("megatraind is shutting down");
  return absl::DeadlineExceededError(absl::StrCat("job '", id, "': no checkpoint committed within ",
                                                  absl::FormatDuration(timeout)));
}

}  // namespace megatrain::server
