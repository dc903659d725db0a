// JobRunner's life (the protocol: job_runner.h): Create loads the store and recovers its jobs
// (restart semantics, crash-loop quarantine), the runner thread's loop with each run's
// provenance phase, and Shutdown.
#include "server/job_runner.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "server/input_recheck.h"
#include "server/job_provenance_phase.h"
#include "server/job_runner_internal.h"
#include "server/job_step_observer.h"
#include "server/resumable_failure.h"

namespace megatrain::server {

using job_runner_internal::CheckpointNote;
using job_runner_internal::NowMs;

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
      if (cancel_running_) {  // asked while its inputs were checked: the user's word wins
        e.job.Mutable().set_finished_unix_ms(NowMs());
        TransitionLocked(e, v1::CANCELLED, "cancelled before its first step", "cancel");
        continue;
      }
      // Shown by `megatrain status`; cleared by a resume.
      e.job.Mutable().set_failure_reason(refusal);
      TransitionLocked(e, v1::PAUSED, refusal, "data_change_refused");
      continue;
    }
    // A job on several machines runs in rank processes, on devices of their own.
    const bool in_rank_processes = !validated->hosts.empty();
    StepObserver observer(*this, id);
    const absl::Status status = run.ok() ? engine_.Run(id, *run, observer) : run.status();
    const absl::Status device_health = engine_.DeviceHealth();
    if (metrics_ != nullptr) metrics_->EndJob();
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = jobs_.at(id);
    running_.clear();
    // Before the transition below, so watchers that see the job end see the daemon's health too.
    // A fault the ranks report says nothing about this daemon's device.
    if (!device_health.ok() || (IsDeviceFault(status) && !in_rank_processes)) {
      healthy_ = false;
      unhealthy_reason_ =
          std::string(device_health.ok() ? status.message() : device_health.message());
      log_.JobEvent("device_fault", id, {{"error", unhealthy_reason_}});
    }
    if (status.ok()) {
      e.job.Mutable().set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::SUCCEEDED, "finished", "completion");
    } else if (cancel_running_ && (status.code() == absl::StatusCode::kCancelled || !run.ok())) {
      // Cancelled while it ran, or while its inputs were checked and that check then failed.
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
    } else if (IsResumableFailure(status) && stop_running_) {
      // Ended during the daemon's shutdown: continues on the next start, as a stopped job does.
      TransitionLocked(e, v1::QUEUED,
                       absl::StrCat(status.message(), "; on the next start it continues ",
                                    CheckpointNote(*e.job)),
                       "interrupted_by_shutdown");
    } else if (IsResumableFailure(status)) {
      // Shown by `megatrain status`; cleared by a resume.
      e.job.Mutable().set_failure_reason(std::string(status.message()));
      TransitionLocked(e, v1::PAUSED,
                       absl::StrCat(status.message(), "; ResumeJob continues ",
                                    CheckpointNote(*e.job)),
                       "ranks_ended");
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
