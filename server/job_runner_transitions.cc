// JobRunner's writes with mu_ held: a job's state transitions (persisted, evented, audited,
// logged, counted, watchers woken), audit rows, and what a failed state-database write turns
// the daemon into (protocol 9 in job_runner.h).
#include "server/job_runner.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "server/job_runner_internal.h"

namespace megatrain::server {

using job_runner_internal::NowMs;

void JobRunner::PersistLocked(Entry& entry) {
  (void)writer_.PutJob(entry.sequence, *entry.job);  // a failure: StoreFailedLocked
}

void JobRunner::AuditLocked(const std::string& id, const std::string& kind,
                            const std::string& message) {
  (void)writer_.AppendAudit(id, NowMs(), kind, message);  // kept pending on a failure
}

void JobRunner::StoreFailedLocked(const std::string& failure) {
  const std::string reason =
      absl::StrCat("state database write failed (", failure,
                   "); megatraind takes and starts no jobs until it is restarted, so its memory "
                   "and the database do not diverge");
  unhealthy_reason_ = healthy_ ? reason : absl::StrCat(unhealthy_reason_, "; ", reason);
  healthy_ = false;
  if (!running_.empty()) stop_running_ = true;  // checkpoint, stop; continues after a restart
  log_.Event("store_failed", {{"reason", reason}});
  if (metrics_ != nullptr) metrics_->SetHealthy(false);
  NotifyChangedLocked();
}

void JobRunner::TransitionLocked(Entry& entry, v1::JobState state, const std::string& message,
                                 const char* audit_kind) {
  entry.job.Mutable().set_state(state);
  entry.message = message;
  ++entry.version;
  PersistLocked(entry);
  v1::ProgressEvent event;
  event.set_job_id(entry.job->id());
  event.set_state(state);
  *event.mutable_progress() = entry.job->progress();
  event.set_message(message);
  event.set_unix_ms(NowMs());
  (void)writer_.AppendEvent(event);  // a failure: StoreFailedLocked
  AuditLocked(entry.job->id(), audit_kind,
              absl::StrCat("state ", JobStateName(state), ": ", message));
  log_.JobEvent("job_state", entry.job->id(),
                {{"state", JobStateName(state)}, {"message", message}});
  PublishCountsLocked();
  NotifyChangedLocked();
}

void JobRunner::PublishCountsLocked() {
  if (metrics_ == nullptr) return;
  std::map<std::string, int> counts;
  for (int s = v1::QUEUED; s <= v1::CANCELLED; ++s) counts[JobStateName(v1::JobState(s))] = 0;
  for (const auto& [id, e] : jobs_) ++counts[JobStateName(e.job->state())];
  metrics_->SetJobsByState(counts);
  metrics_->SetQueueLength(static_cast<int>(queue_.size()));
  metrics_->SetHealthy(healthy_);
}

void JobRunner::RecordAccessRefusal(const std::string& id, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  log_.JobEvent("access_refused", id, {{"message", message}});
  if (FindLocked(id) != nullptr) AuditLocked(id, "access_refused", message);
}

}  // namespace megatrain::server
