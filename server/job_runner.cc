// JobRunner (see job_runner.h for the protocol).
#include "server/job_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/manifest.h"
#include "engine/provenance/record.h"
#include "engine/provenance/sha256.h"
#include "server/input_recheck.h"
#include "server/job_lineage.h"
#include "server/job_provenance_phase.h"
#include "server/job_step_observer.h"
#include "service/path_policy.h"

namespace megatrain::server {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string CheckpointNote(const v1::Job& job) {
  return job.progress().last_checkpoint().empty()
             ? std::string("no checkpoint yet, so from step 0")
             : absl::StrCat("from its checkpoint ", job.progress().last_checkpoint());
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(
    std::unique_ptr<JobStore> store, JobEngine& engine, DaemonMetrics* metrics, StructuredLog& log,
    uint32_t max_queue_length, const Revalidate& revalidate, JobProvenanceOptions provenance,
    RunnerLimits limits) {
  absl::StatusOr<std::vector<JobStore::StoredJob>> stored = store->LoadJobs();
  if (!stored.ok()) return stored.status();
  absl::StatusOr<std::map<std::string, std::string>> lineages = store->LoadLineages();
  if (!lineages.ok()) return lineages.status();
  absl::StatusOr<std::unique_ptr<JobStore>> reader = store->OpenReader();
  if (!reader.ok()) return reader.status();
  absl::StatusOr<int64_t> max_purged = store->LoadMaxPurgedSequence();
  if (!max_purged.ok()) return max_purged.status();
  std::unique_ptr<JobRunner> runner(new JobRunner(std::move(store), *std::move(reader), engine,
                                                  metrics, log, max_queue_length, revalidate,
                                                  std::move(provenance), limits));
  std::lock_guard<std::mutex> lock(runner->mu_);
  runner->next_sequence_ = *max_purged + 1;  // a purged job's id is never given again
  std::vector<std::string> interrupted, queued;
  for (JobStore::StoredJob& s : *stored) {
    runner->next_sequence_ = std::max(runner->next_sequence_, s.sequence + 1);
    Entry& e = runner->jobs_[s.job.id()];
    e.sequence = s.sequence;
    e.job = SharedJob(std::move(s.job));
    if (auto l = lineages->find(e.job->id()); l != lineages->end()) {
      absl::StatusOr<provenance::Lineage> lineage =
          provenance::ParseLineage(l->second, absl::StrCat("lineage of job ", e.job->id()));
      // A job must not continue without the record its data is checked against.
      if (!lineage.ok()) {
        return absl::DataLossError(absl::StrCat("state database: ", lineage.status().message()));
      }
      e.lineage = *std::move(lineage);
    }
    if (e.job->state() == v1::RUNNING) interrupted.push_back(e.job->id());
    if (e.job->state() == v1::QUEUED) queued.push_back(e.job->id());
  }
  for (const std::string& id : interrupted) {
    Entry& e = runner->jobs_.at(id);
    const std::string last_checkpoint = e.job->progress().last_checkpoint();
    e.job.Mutable().clear_progress();
    e.job.Mutable().mutable_progress()->set_total_steps(e.job->spec().hyper().steps());
    e.job.Mutable().mutable_progress()->set_last_checkpoint(last_checkpoint);
    runner->TransitionLocked(
        e, v1::QUEUED,
        absl::StrCat("daemon restarted while the job ran; it continues ", CheckpointNote(*e.job)),
        "requeued_after_restart");
  }
  // Crash-loop quarantine (issue 16, point 7): a job that keeps taking the daemon down is not
  // re-run forever.
  std::vector<std::string> requeue;
  for (const std::string& id : interrupted) {
    const int crashes = runner->CrashesSinceProgressLocked(id);
    if (limits.max_job_crashes == 0 || crashes < static_cast<int>(limits.max_job_crashes)) {
      requeue.push_back(id);
      continue;
    }
    Entry& e = runner->jobs_.at(id);
    e.job.Mutable().set_failure_reason(absl::StrCat(
        "quarantined: megatraind stopped without a clean shutdown (crash, OOM kill, SIGBUS, "
        "SIGKILL) ",
        crashes,
        " times while this job ran, since its last checkpoint or resume; it is not "
        "run again (max_job_crashes=",
        limits.max_job_crashes, ")"));
    e.job.Mutable().set_finished_unix_ms(NowMs());
    runner->log_.JobEvent("job_quarantined", id, {{"crashes", absl::StrCat(crashes)}});
    runner->TransitionLocked(e, v1::FAILED, e.job->failure_reason(), "failure");
  }
  interrupted = std::move(requeue);
  interrupted.insert(interrupted.end(), queued.begin(), queued.end());
  for (const std::string& id : interrupted) {
    Entry& e = runner->jobs_.at(id);
    absl::StatusOr<service::ValidatedJob> validated = revalidate(e.job->spec());
    if (!validated.ok()) {
      e.job.Mutable().set_failure_reason(
          absl::StrCat("re-validation after restart: ", validated.status().ToString()));
      e.job.Mutable().set_finished_unix_ms(NowMs());
      runner->TransitionLocked(e, v1::FAILED, e.job->failure_reason(), "failure");
      continue;
    }
    e.validated = std::move(*validated);
    runner->queue_.push_back(id);
    runner->log_.JobEvent("job_recovered", id, {{"state", "QUEUED"}});
  }
  runner->PublishCountsLocked();
  return runner;
}

JobRunner::~JobRunner() { Shutdown(); }

int JobRunner::CrashesSinceProgressLocked(const std::string& id) {
  absl::StatusOr<std::vector<service::AuditRow>> rows = store_->LoadAudit(id);
  if (!rows.ok()) {
    log_.JobEvent("store_error", id, {{"error", rows.status().ToString()}});
    return 0;
  }
  int crashes = 0;
  for (const service::AuditRow& row : *rows) {
    if (row.kind == "requeued_after_restart") ++crashes;
    if (row.kind == "checkpoint" || row.kind == "resume") crashes = 0;
  }
  return crashes;
}

void JobRunner::Start() {
  thread_ = std::thread([this] { Loop(); });
}

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

const JobRunner::Entry* JobRunner::FindLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
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

bool JobRunner::Known(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(id) != nullptr;
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

absl::StatusOr<service::ValidatedJob> JobRunner::PrepareRun(
    const std::string& id, const service::ValidatedJob& validated, std::string* refusal,
    engine::InputFiles* inputs) {
  // The inputs as they are now, before anything reads them, held open: the lineage below and
  // the engine read these descriptors, never the paths again (issue 16, point 2).
  absl::StatusOr<engine::InputFiles> checked = RecheckJobInputs(validated);
  if (!checked.ok()) {
    return absl::Status(checked.status().code(), absl::StrCat("inputs checked when the job runs: ",
                                                              checked.status().message()));
  }
  *inputs = *std::move(checked);
  if (limits_.test_after_input_check) limits_.test_after_input_check(id);
  service::ValidatedJob held = validated;
  held.options.inputs = inputs;
  std::optional<provenance::Lineage> lineage;
  bool allow_data_change = false;
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = jobs_.at(id);
    lineage = e.lineage;
    allow_data_change = e.allow_data_change;
    e.allow_data_change = false;
    spec = e.job->spec();
  }
  // Files are hashed without mu_ (seconds per GB); what the phase decided is recorded under it.
  absl::StatusOr<ProvenanceDecision> decision =
      DecideProvenance(id, spec, held, lineage, allow_data_change, provenance_.device_kind);
  if (!decision.ok()) return decision.status();
  if (!decision->refusal.empty()) {
    *refusal = decision->refusal;
    return absl::FailedPreconditionError(*refusal);
  }
  if (decision->record) {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = writer_.PutLineage(id, provenance::LineageToJson(decision->lineage));
        !s.ok()) {
      return s;
    }
    jobs_.at(id).lineage = decision->lineage;
    for (const ProvenanceAuditRow& row : decision->audit) AuditLocked(id, row.kind, row.message);
    if (decision->allowed_changes > 0) {
      log_.JobEvent("data_change_allowed", id,
                    {{"files", absl::StrCat(decision->allowed_changes)}});
    }
  }
  return WithProvenance(held, decision->lineage, provenance_.signer);
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

void JobRunner::Loop() {
  while (true) {
    std::string id;
    const service::ValidatedJob* validated = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || (healthy_ && !queue_.empty()); });
      if (stopping_) break;
      id = queue_.front();
      queue_.pop_front();
      Entry& e = jobs_.at(id);
      running_ = id;
      cancel_running_ = false;
      pause_running_ = false;
      checkpoint_requested_ = false;
      e.job.Mutable().set_started_unix_ms(NowMs());
      const std::string last_checkpoint = e.job->progress().last_checkpoint();
      e.job.Mutable().clear_progress();
      e.job.Mutable().mutable_progress()->set_total_steps(e.job->spec().hyper().steps());
      e.job.Mutable().mutable_progress()->set_last_checkpoint(last_checkpoint);
      e.job.Mutable().mutable_progress()->set_validation_loss(
          std::numeric_limits<double>::quiet_NaN());
      validated = &*e.validated;
      TransitionLocked(e, v1::RUNNING, "started", "start");
    }
    std::string refusal;
    engine::InputFiles inputs;  // the run reads through these: alive until engine_.Run returns
    absl::StatusOr<service::ValidatedJob> run = PrepareRun(id, *validated, &refusal, &inputs);
    if (!refusal.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = jobs_.at(id);
      running_.clear();
      // Shown by `megatrain status`; cleared by a resume.
      e.job.Mutable().set_failure_reason(refusal);
      TransitionLocked(e, v1::PAUSED, refusal, "data_change_refused");
      continue;
    }
    StepObserver observer(*this, id);
    const absl::Status status = run.ok() ? engine_.Run(id, *run, observer) : run.status();
    const absl::Status device_health = engine_.DeviceHealth();
    if (metrics_ != nullptr) metrics_->EndJob();
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = jobs_.at(id);
    running_.clear();
    // Before the transition below, so watchers that see the job end see the daemon's health too.
    if (!device_health.ok() || IsDeviceFault(status)) {
      healthy_ = false;
      unhealthy_reason_ =
          std::string(device_health.ok() ? status.message() : device_health.message());
      log_.JobEvent("device_fault", id, {{"error", unhealthy_reason_}});
    }
    if (status.ok()) {
      e.job.Mutable().set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::SUCCEEDED, "finished", "completion");
    } else if (cancel_running_ && status.code() == absl::StatusCode::kCancelled) {
      e.job.Mutable().set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::CANCELLED, "cancelled while running", "cancel");
    } else if (pause_running_ && status.code() == absl::StatusCode::kCancelled) {
      TransitionLocked(e, v1::PAUSED,
                       absl::StrCat("paused after step ", e.job->progress().step(),
                                    "; ResumeJob continues ", CheckpointNote(*e.job)),
                       "pause");
    } else if (stop_running_ && status.code() == absl::StatusCode::kCancelled) {
      const bool store_failed = !writer_.failure().empty() && !stopping_;
      TransitionLocked(e, v1::QUEUED,
                       absl::StrCat(store_failed ? "stopped because a state database write failed"
                                                 : "interrupted by daemon shutdown",
                                    " after step ", e.job->progress().step(),
                                    "; on the next start it continues ", CheckpointNote(*e.job)),
                       store_failed ? "stopped_store_failed" : "interrupted_by_shutdown");
    } else {
      e.job.Mutable().set_failure_reason(status.ToString());
      e.job.Mutable().set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::FAILED, e.job->failure_reason(), "failure");
    }
  }
  std::lock_guard<std::mutex> lock(done_mu_);
  loop_done_ = true;
  done_cv_.notify_all();
}

bool JobRunner::Shutdown(absl::Duration timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return true;
    stopping_ = true;
    stop_running_ = true;
    NotifyChangedLocked();
  }
  if (!thread_.joinable()) return true;
  std::unique_lock<std::mutex> lock(done_mu_);
  if (!done_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return loop_done_; })) {
    lock.unlock();
    thread_.detach();
    return false;
  }
  lock.unlock();
  thread_.join();
  std::lock_guard<std::mutex> runner_lock(mu_);
  // Rows a failed write left behind, written now or logged in full (protocol 9).
  if (absl::Status s = writer_.Flush(/*final=*/true); !s.ok()) {
    log_.Event("store_unflushed", {{"audit_rows", absl::StrCat(writer_.pending_audit_rows())},
                                   {"error", s.ToString()}});
  }
  return true;
}

}  // namespace megatrain::server
