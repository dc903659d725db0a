// JobRunner::StepObserver (see job_step_observer.h).
#include "server/job_step_observer.h"

#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/manifest.h"
#include "engine/provenance/record.h"
#include "engine/provenance/sha256.h"
#include "server/job_eval_prompts.h"
#include "server/job_runner_internal.h"

namespace megatrain::server {

using job_runner_internal::NowMs;

// Single-line kept lines (the data summary, a tokenization phase) become the job's latest
// message, so watchers see what a run does before its first step; tables are not shown.
void JobRunner::StepObserver::OnLine(const std::string& line, bool keep) {
  if (!keep || line.find('\n') != std::string::npos) return;
  std::lock_guard<std::mutex> lock(runner_.mu_);
  Entry& e = runner_.jobs_.at(id_);
  e.message = line;
  ++e.version;
  runner_.log_.JobEvent("engine", id_, {{"line", line}});
  runner_.NotifyChangedLocked();
}

void JobRunner::StepObserver::OnStep(const engine::StepReport& report, double validation_loss) {
  if (runner_.metrics_ != nullptr) runner_.metrics_->RecordStep(report, validation_loss);
  runner_.histories_.Record(id_, report, validation_loss, NowMs());  // its own lock, not mu_
  std::unique_lock<std::mutex> lock(runner_.mu_);
  Entry& e = runner_.jobs_.at(id_);
  v1::Progress& p = *e.job.Mutable().mutable_progress();
  if (!first_step_seen_) {
    first_step_seen_ = true;
    first_step_ = report.step;
    // Every step processes batch_size x seq_len tokens, so the checkpoint's step (the one
    // before this) gives the tokens of the whole job so far, not only since the resume.
    p.set_tokens((report.step - 1) * static_cast<uint64_t>(report.tokens));
    if (report.step > 1) {  // the engine continued from a checkpoint
      runner_.log_.JobEvent("job_resumed", id_, {{"from_step", absl::StrCat(report.step - 1)}});
      runner_.TransitionLocked(e, v1::RUNNING,
                               absl::StrCat("resumed from step ", report.step - 1, " (",
                                            e.job->progress().last_checkpoint(), ")"),
                               "resumed_from_checkpoint");
    }
  }
  p.set_step(report.step);
  p.set_tokens(p.tokens() + static_cast<uint64_t>(report.tokens));
  p.set_loss(report.loss);
  p.set_validation_loss(validation_loss);
  p.set_learning_rate(report.learning_rate);
  p.set_tokens_per_second(report.tokens_per_second);
  p.set_skipped_steps(report.skipped_total);
  const double elapsed = static_cast<double>(NowMs() - e.job->started_unix_ms()) / 1000.0;
  const uint64_t steps_this_run = report.step - first_step_ + 1;
  p.set_eta_seconds(report.step < first_step_
                        ? 0
                        : elapsed / static_cast<double>(steps_this_run) *
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
  LogActivationModesIfChanged(report);
  runner_.NotifyChangedLocked();
  const uint64_t hold = runner_.limits_.test_hold_after_step;
  // A job on several machines holds in its ranks (megatrain_rank): here the supervisor reading
  // them must keep reading, to see a rank die during the hold.
  if (hold != 0 && first_step_ <= hold && report.step >= hold && report.step < p.total_steps() &&
      e.job->spec().hosts_size() == 0) {
    // The test hook (RunnerLimits): wait for a stop or a checkpoint request, on state only.
    if (!held_logged_) {
      held_logged_ = true;
      runner_.log_.JobEvent("test_hold", id_, {{"step", absl::StrCat(report.step)}});
    }
    runner_.changed_.wait(lock, [&] {
      return runner_.cancel_running_ || runner_.stop_running_ || runner_.pause_running_ ||
             runner_.checkpoint_requested_ || runner_.checkpoint_waiters_ > 0;
    });
  }
}

void JobRunner::StepObserver::LogActivationModesIfChanged(const engine::StepReport& report) {
  std::string modes;
  std::vector<std::string> keys;  // the fields' names point into these
  for (const engine::ActivationBlockReport& b : report.activation_blocks) {
    const std::string layers =
        b.num_layers > 1 ? absl::StrCat(b.first_layer, "-", b.first_layer + b.num_layers - 1)
                         : absl::StrCat(b.first_layer);
    absl::StrAppend(&modes, modes.empty() ? "" : " ", layers, ":", b.mode);
    keys.push_back(absl::StrCat("layers_", layers));
  }
  if (modes == activation_modes_) return;
  activation_modes_ = modes;
  StructuredLog::Fields fields = {{"step", absl::StrCat(report.step)}, {"modes", modes}};
  for (size_t i = 0; i < keys.size(); ++i) {
    fields.push_back({keys[i], report.activation_blocks[i].reason});
  }
  runner_.log_.JobEvent("activation_modes", id_, fields);
}

bool JobRunner::StepObserver::ShouldStop() {
  return runner_.cancel_running_ || runner_.stop_running_ || runner_.pause_running_;
}

// A pause or a shutdown keeps the work done; a cancel does not.
bool JobRunner::StepObserver::CheckpointBeforeStop() { return !runner_.cancel_running_; }

bool JobRunner::StepObserver::ShouldCheckpoint() {
  return runner_.checkpoint_requested_.exchange(false);
}

void JobRunner::StepObserver::OnCheckpoint(uint64_t step, const std::string& path) {
  v1::CheckpointRecord record;
  record.set_job_id(id_);
  record.set_step(step);
  record.set_path(path);
  record.set_created_unix_ms(NowMs());
  // A manifest that cannot be hashed leaves the record's hash empty and
  // says why in the log (the checkpoint's own verification still applies
  // when it is loaded); it is never silent.
  absl::StatusOr<std::string> manifest_sha =
      provenance::Sha256FileHex(path + "/" + engine::kManifestFileName);
  std::lock_guard<std::mutex> lock(runner_.mu_);
  if (manifest_sha.ok()) {
    record.set_manifest_sha256(*manifest_sha);
  } else {
    runner_.log_.JobEvent("checkpoint_error", id_,
                          {{"path", path}, {"error", manifest_sha.status().ToString()}});
  }
  if (absl::Status s = runner_.writer_.PutCheckpoint(record); !s.ok()) {
    // StoreWriter logged it and made the daemon stop taking jobs (protocol 9).
  }
  // A scheduled checkpoint at or after the requested step answers an on-demand request too.
  if (step >= runner_.checkpoint_request_step_) runner_.checkpoint_requested_ = false;
  Entry& e = runner_.jobs_.at(id_);
  e.job.Mutable().mutable_progress()->set_last_checkpoint(path);
  e.last_checkpoint = record;
  ++e.checkpoints_committed;
  runner_.log_.JobEvent("checkpoint", id_, {{"step", absl::StrCat(step)}, {"path", path}});
  // An unsigned run writes no provenance.json: its hash is then not shown.
  const absl::StatusOr<std::string> provenance_sha =
      provenance::Sha256FileHex(path + "/" + provenance::kProvenanceFileName);
  runner_.TransitionLocked(
      e, e.job->state(),
      absl::StrCat("checkpoint of step ", step, " written: ", path,
                   provenance_sha.ok()
                       ? absl::StrCat(" (provenance.json sha256 ", *provenance_sha, ")")
                       : ""),
      "checkpoint");
}

void JobRunner::StepObserver::OnEvalReplies(uint64_t step,
                                            std::vector<engine::EvalReplyReport>& replies) {
  std::vector<v1::EvalReply> round;
  for (const engine::EvalReplyReport& r : replies) round.push_back(ToEvalReply(step, r));
  runner_.histories_.RecordEvalReplies(id_, round);  // its own lock, not mu_
  std::lock_guard<std::mutex> lock(runner_.mu_);
  Entry& e = runner_.jobs_.at(id_);
  for (const v1::EvalReply& reply : round) {
    v1::ProgressEvent event;
    event.set_job_id(id_);
    event.set_state(e.job->state());
    *event.mutable_progress() = e.job->progress();
    event.set_message(EvalReplyLine(reply));
    *event.mutable_eval_reply() = reply;
    event.set_unix_ms(NowMs());
    (void)runner_.writer_.AppendEvent(event);  // a failure: StoreFailedLocked
    runner_.log_.JobEvent("eval_reply", id_,
                          {{"step", absl::StrCat(step)},
                           {"index", absl::StrCat(reply.index())},
                           {"tokens", absl::StrCat(reply.tokens())},
                           {"stopped", reply.stopped() ? "true" : "false"},
                           {"line", event.message()}});
    e.eval_reply_events.push_back(std::move(event));
    if (e.eval_reply_events.size() > kHeldEvalReplyEvents) e.eval_reply_events.pop_front();
    ++e.eval_reply_events_total;
  }
  ++e.version;
  runner_.NotifyChangedLocked();
}

v1::TierUsage JobRunner::StepObserver::MakeTier(const char* tier, uint64_t bytes) {
  v1::TierUsage t;
  t.set_tier(tier);
  t.set_bytes(bytes);
  return t;
}

}  // namespace megatrain::server
