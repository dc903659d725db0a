// JobRunner's read side: jobs, pages of them, history, audit, lineage, checkpoints, status, and
// the waits for a change; none of it changes a job, and copies are made without mu_
// (protocol 8 in job_runner.h).
#include "server/job_runner.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace megatrain::server {

const JobRunner::Entry* JobRunner::FindLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

bool JobRunner::Known(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(id) != nullptr;
}

absl::StatusOr<v1::Job> JobRunner::Get(const std::string& id) const {
  std::shared_ptr<const v1::Job> snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Entry* e = FindLocked(id);
    if (e == nullptr) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
    snapshot = e->job.Snapshot();
  }
  return *snapshot;  // copied without mu_ (protocol 8)
}

std::vector<v1::Job> JobRunner::List(const std::vector<v1::JobState>& states) const {
  int64_t next_after = 0;
  return ListPage(states, 0, std::numeric_limits<size_t>::max(), &next_after);
}

std::vector<v1::Job> JobRunner::ListPage(const std::vector<v1::JobState>& states,
                                         int64_t after_sequence, size_t limit,
                                         int64_t* next_after) const {
  // Under mu_ only reference counts are taken (protocol 8); the copies are made after.
  std::vector<std::pair<int64_t, std::shared_ptr<const v1::Job>>> snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : jobs_) {
      if (e.sequence <= after_sequence) continue;
      if (states.empty() ||
          std::find(states.begin(), states.end(), e.job->state()) != states.end()) {
        snapshot.emplace_back(e.sequence, e.job.Snapshot());
      }
    }
  }
  if (limits_.test_read_hook) limits_.test_read_hook("List");
  std::sort(snapshot.begin(), snapshot.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  *next_after = 0;
  if (snapshot.size() > limit) {
    snapshot.resize(limit);
    *next_after = snapshot.empty() ? after_sequence : snapshot.back().first;
  }
  std::vector<v1::Job> jobs;
  jobs.reserve(snapshot.size());
  for (const auto& [sequence, job] : snapshot) jobs.push_back(*job);
  return jobs;
}

absl::StatusOr<v1::JobHistory> JobRunner::History(const std::string& id) const {
  if (!Known(id)) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  std::optional<v1::JobHistory> history = histories_.Get(id);  // its own lock, never mu_
  if (!history.has_value()) {
    history.emplace();
    history->set_job_id(id);
  }
  return *std::move(history);
}

absl::StatusOr<v1::AuditLog> JobRunner::Audit(const std::string& id) const {
  if (!Known(id)) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  // On the reader connection, never under mu_ (protocol 8).
  std::lock_guard<std::mutex> lock(reader_mu_);
  if (limits_.test_read_hook) limits_.test_read_hook("Audit");
  absl::StatusOr<std::vector<service::AuditRow>> rows = reader_->LoadAudit(id);
  if (!rows.ok()) return rows.status();
  return service::CheckedAuditLog(*rows);
}

absl::StatusOr<provenance::Lineage> JobRunner::JobLineage(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = FindLocked(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  if (!e->lineage.has_value()) {
    return absl::NotFoundError(absl::StrCat("job '", id, "' has not started; no lineage yet"));
  }
  return *e->lineage;
}

absl::StatusOr<std::vector<v1::CheckpointRecord>> JobRunner::Checkpoints(
    const std::string& id) const {
  if (!Known(id)) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  std::lock_guard<std::mutex> lock(reader_mu_);  // the reader connection, never under mu_
  if (limits_.test_read_hook) limits_.test_read_hook("Checkpoints");
  return reader_->LoadCheckpoints(id);
}

RunnerStatus JobRunner::Status() const {
  RunnerStatus status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status.healthy = healthy_;
    status.unhealthy_reason = unhealthy_reason_;
    status.queued = static_cast<int>(queue_.size());
    status.running_job_id = running_;
  }
  // Outside mu_: the devices answer from their own locks, never the runner's.
  status.devices = engine_.Devices();
  return status;
}

absl::StatusOr<bool> JobRunner::WaitForChange(const std::string& id, uint64_t* version,
                                              absl::Duration timeout, v1::Job* job,
                                              std::string* message) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto not_found = [&] {
    return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  };
  if (FindLocked(id) == nullptr) return not_found();
  // Looked up again after every wake: PurgeJobs may have removed the job meanwhile.
  const bool changed = changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
    const Entry* e = FindLocked(id);
    return e == nullptr || e->version != *version || stopping_;
  });
  const Entry* e = FindLocked(id);
  if (e == nullptr) return not_found();
  if (e->version == *version && stopping_) {
    return absl::UnavailableError("megatraind is shutting down");
  }
  if (!changed || e->version == *version) return false;
  *version = e->version;
  *message = e->message;
  const std::shared_ptr<const v1::Job> snapshot = e->job.Snapshot();
  lock.unlock();
  *job = *snapshot;  // copied without mu_ (protocol 8)
  return true;
}

std::vector<v1::ProgressEvent> JobRunner::EvalReplyEventsSince(const std::string& id,
                                                               uint64_t* cursor) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = FindLocked(id);
  if (e == nullptr) return {};
  const uint64_t total = e->eval_reply_events_total;
  const uint64_t held = e->eval_reply_events.size();
  const uint64_t from = std::max(*cursor, total - held);
  std::vector<v1::ProgressEvent> events(
      e->eval_reply_events.begin() + static_cast<int64_t>(from - (total - held)),
      e->eval_reply_events.end());
  *cursor = total;
  return events;
}

absl::StatusOr<bool> JobRunner::WaitForAnyChange(uint64_t* generation,
                                                 absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  const bool changed = changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                                         [&] { return generation_ != *generation || stopping_; });
  if (stopping_) return absl::UnavailableError("megatraind is shutting down");
  *generation = generation_;
  return changed;
}

}  // namespace megatrain::server
