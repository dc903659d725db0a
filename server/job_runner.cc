// JobRunner (see job_runner.h for the protocol).
#include "server/job_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace megatrain::server {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

}  // namespace

std::string JobStateName(v1::JobState state) {
  return state == v1::JOB_STATE_UNSPECIFIED ? "UNSPECIFIED" : v1::JobState_Name(state);
}

// Reports the running job's steps to the runner; polled for stop requests between steps.
class JobRunner::StepObserver final : public engine::TrainingObserver {
 public:
  StepObserver(JobRunner& runner, std::string id) : runner_(runner), id_(std::move(id)) {}

  void OnStep(const engine::StepReport& report, double validation_loss) override {
    if (runner_.metrics_ != nullptr) runner_.metrics_->RecordStep(report, validation_loss);
    std::lock_guard<std::mutex> lock(runner_.mu_);
    Entry& e = runner_.jobs_.at(id_);
    v1::Progress& p = *e.job.mutable_progress();
    p.set_step(report.step);
    p.set_tokens(p.tokens() + static_cast<uint64_t>(report.tokens));
    p.set_loss(report.loss);
    p.set_validation_loss(validation_loss);
    p.set_learning_rate(report.learning_rate);
    p.set_tokens_per_second(report.tokens_per_second);
    p.set_skipped_steps(report.skipped_total);
    const double elapsed = static_cast<double>(NowMs() - e.job.started_unix_ms()) / 1000.0;
    p.set_eta_seconds(report.step == 0 ? 0
                                       : elapsed / static_cast<double>(report.step) *
                                             static_cast<double>(p.total_steps() - report.step));
    p.clear_memory();
    const v1::TierUsage device = MakeTier("device", report.device_arena_bytes);
    *p.add_memory() = device;
    *p.add_memory() = MakeTier("pinned", report.pinned_host_bytes);
    *p.add_memory() = MakeTier("ram", report.pageable_host_bytes);
    ++e.version;
    e.message = "";
    const int64_t now = NowMs();
    if (now - e.last_persist_ms >= 1000 || report.step == p.total_steps()) {
      e.last_persist_ms = now;
      runner_.PersistLocked(e);
      runner_.log_.JobEvent(
          "step", id_,
          {{"step", absl::StrCat(report.step)},
           {"loss", absl::StrFormat("%.4f", report.loss)},
           {"tokens_per_second", absl::StrFormat("%.0f", report.tokens_per_second)}});
    }
    runner_.changed_.notify_all();
  }

  bool ShouldStop() override { return runner_.cancel_running_ || runner_.stop_running_; }

 private:
  static v1::TierUsage MakeTier(const char* tier, uint64_t bytes) {
    v1::TierUsage t;
    t.set_tier(tier);
    t.set_bytes(bytes);
    return t;
  }

  JobRunner& runner_;
  const std::string id_;
};

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(
    std::unique_ptr<JobStore> store, JobEngine& engine, DaemonMetrics* metrics, StructuredLog& log,
    uint32_t max_queue_length, const Revalidate& revalidate) {
  absl::StatusOr<std::vector<JobStore::StoredJob>> stored = store->LoadJobs();
  if (!stored.ok()) return stored.status();
  std::unique_ptr<JobRunner> runner(
      new JobRunner(std::move(store), engine, metrics, log, max_queue_length));
  std::lock_guard<std::mutex> lock(runner->mu_);
  std::vector<std::string> interrupted, queued;
  for (JobStore::StoredJob& s : *stored) {
    runner->next_sequence_ = std::max(runner->next_sequence_, s.sequence + 1);
    Entry& e = runner->jobs_[s.job.id()];
    e.sequence = s.sequence;
    e.job = std::move(s.job);
    if (e.job.state() == v1::RUNNING) interrupted.push_back(e.job.id());
    if (e.job.state() == v1::QUEUED) queued.push_back(e.job.id());
  }
  for (const std::string& id : interrupted) {
    Entry& e = runner->jobs_.at(id);
    e.job.clear_progress();
    e.job.mutable_progress()->set_total_steps(e.job.spec().hyper().steps());
    runner->TransitionLocked(e, v1::QUEUED,
                             "daemon restarted while the job ran; it starts again from step 0 "
                             "(checkpoint resume is not wired yet)");
  }
  interrupted.insert(interrupted.end(), queued.begin(), queued.end());
  for (const std::string& id : interrupted) {
    Entry& e = runner->jobs_.at(id);
    absl::StatusOr<ValidatedJob> validated = revalidate(e.job.spec());
    if (!validated.ok()) {
      e.job.set_failure_reason(
          absl::StrCat("re-validation after restart: ", validated.status().ToString()));
      e.job.set_finished_unix_ms(NowMs());
      runner->TransitionLocked(e, v1::FAILED, e.job.failure_reason());
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

void JobRunner::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void JobRunner::PersistLocked(Entry& entry) {
  if (absl::Status s = store_->PutJob(entry.sequence, entry.job); !s.ok()) {
    log_.JobEvent("store_error", entry.job.id(), {{"error", s.ToString()}});
  }
}

void JobRunner::TransitionLocked(Entry& entry, v1::JobState state, const std::string& message) {
  entry.job.set_state(state);
  entry.message = message;
  ++entry.version;
  PersistLocked(entry);
  v1::ProgressEvent event;
  event.set_job_id(entry.job.id());
  event.set_state(state);
  *event.mutable_progress() = entry.job.progress();
  event.set_message(message);
  event.set_unix_ms(NowMs());
  if (absl::Status s = store_->AppendEvent(event); !s.ok()) {
    log_.JobEvent("store_error", entry.job.id(), {{"error", s.ToString()}});
  }
  log_.JobEvent("job_state", entry.job.id(),
                {{"state", JobStateName(state)}, {"message", message}});
  PublishCountsLocked();
  changed_.notify_all();
}

void JobRunner::PublishCountsLocked() {
  if (metrics_ == nullptr) return;
  std::map<std::string, int> counts;
  for (int s = v1::QUEUED; s <= v1::CANCELLED; ++s) counts[JobStateName(v1::JobState(s))] = 0;
  for (const auto& [id, e] : jobs_) ++counts[JobStateName(e.job.state())];
  metrics_->SetJobsByState(counts);
  metrics_->SetQueueLength(static_cast<int>(queue_.size()));
  metrics_->SetHealthy(healthy_);
}

absl::StatusOr<v1::Job> JobRunner::Submit(const v1::JobSpec& spec, ValidatedJob job) {
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
  const int64_t sequence = next_sequence_++;
  const std::string id = absl::StrFormat("job-%06d", sequence);
  Entry& e = jobs_[id];
  e.sequence = sequence;
  e.job.set_id(id);
  *e.job.mutable_spec() = spec;
  e.job.set_submitted_unix_ms(NowMs());
  e.job.mutable_progress()->set_total_steps(spec.hyper().steps());
  e.job.mutable_progress()->set_validation_loss(std::numeric_limits<double>::quiet_NaN());
  e.validated = std::move(job);
  queue_.push_back(id);
  TransitionLocked(e, v1::QUEUED, "submitted");
  return e.job;
}

const JobRunner::Entry* JobRunner::FindLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<v1::Job> JobRunner::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = FindLocked(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  return e->job;
}

std::vector<v1::Job> JobRunner::List(const std::vector<v1::JobState>& states) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Entry*> entries;
  for (const auto& [id, e] : jobs_) {
    if (states.empty() || std::find(states.begin(), states.end(), e.job.state()) != states.end()) {
      entries.push_back(&e);
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry* a, const Entry* b) { return a->sequence < b->sequence; });
  std::vector<v1::Job> jobs;
  for (const Entry* e : entries) jobs.push_back(e->job);
  return jobs;
}

absl::StatusOr<v1::Job> JobRunner::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  Entry& e = it->second;
  if (IsTerminal(e.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' already ended as ", JobStateName(e.job.state())));
  }
  if (id == running_) {
    cancel_running_ = true;
    e.message = "cancel requested";
    ++e.version;
    changed_.notify_all();
    log_.JobEvent("cancel_requested", id);
    return e.job;
  }
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  e.job.set_finished_unix_ms(NowMs());
  TransitionLocked(e, v1::CANCELLED, "cancelled while queued");
  return e.job;
}

absl::StatusOr<std::vector<v1::CheckpointRecord>> JobRunner::Checkpoints(
    const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (FindLocked(id) == nullptr) {
    return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  }
  return store_->LoadCheckpoints(id);
}

RunnerStatus JobRunner::Status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return RunnerStatus{healthy_, unhealthy_reason_, static_cast<int>(queue_.size()), running_};
}

absl::StatusOr<bool> JobRunner::WaitForChange(const std::string& id, uint64_t* version,
                                              absl::Duration timeout, v1::Job* job,
                                              std::string* message) const {
  std::unique_lock<std::mutex> lock(mu_);
  const Entry* e = FindLocked(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("id: job '", id, "' not found"));
  const bool changed = changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                                         [&] { return e->version != *version || stopping_; });
  if (e->version == *version && stopping_) {
    return absl::UnavailableError("megatraind is shutting down");
  }
  if (!changed || e->version == *version) return false;
  *version = e->version;
  *job = e->job;
  *message = e->message;
  return true;
}

void JobRunner::Loop() {
  while (true) {
    std::string id;
    const ValidatedJob* validated = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || (healthy_ && !queue_.empty()); });
      if (stopping_) break;
      id = queue_.front();
      queue_.pop_front();
      Entry& e = jobs_.at(id);
      running_ = id;
      cancel_running_ = false;
      e.job.set_started_unix_ms(NowMs());
      e.job.clear_progress();
      e.job.mutable_progress()->set_total_steps(e.job.spec().hyper().steps());
      e.job.mutable_progress()->set_validation_loss(std::numeric_limits<double>::quiet_NaN());
      validated = &*e.validated;
      TransitionLocked(e, v1::RUNNING, "started");
    }
    StepObserver observer(*this, id);
    const absl::Status status = engine_.Run(id, *validated, observer);
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = jobs_.at(id);
    running_.clear();
    if (status.ok()) {
      e.job.set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::SUCCEEDED, "finished");
    } else if (cancel_running_ && status.code() == absl::StatusCode::kCancelled) {
      e.job.set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::CANCELLED, "cancelled while running");
    } else if (stop_running_ && status.code() == absl::StatusCode::kCancelled) {
      TransitionLocked(e, v1::QUEUED,
                       "interrupted by daemon shutdown; it starts again on the next start");
    } else {
      if (IsDeviceFault(status)) {
        healthy_ = false;
        unhealthy_reason_ = std::string(status.message());
        log_.JobEvent("device_fault", id, {{"error", status.ToString()}});
      }
      e.job.set_failure_reason(status.ToString());
      e.job.set_finished_unix_ms(NowMs());
      TransitionLocked(e, v1::FAILED, e.job.failure_reason());
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
    changed_.notify_all();
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
  return true;
}

}  // namespace megatrain::server
