// JobRunner: the FIFO queue and the one thread that owns the engine. RPC handlers call the
// thread-safe methods below, which only validate state transitions and hand work over.
//
// Protocol:
//  1. Submit appends a QUEUED job (persisted before it is visible) and wakes the runner.
//  2. The runner takes the oldest queued job while the device is healthy, marks it RUNNING and
//     runs it without holding the lock; each step updates the job's progress and version, each
//     committed checkpoint is recorded in the store and becomes progress.last_checkpoint.
//  3. The run ends as SUCCEEDED, FAILED (reason kept; a device fault also makes the daemon
//     unhealthy and stops the queue), CANCELLED (CancelJob, no checkpoint), PAUSED (PauseJob:
//     checkpoint of the last completed step, then stop), or QUEUED again when the daemon is
//     shutting down (checkpoint first, like a pause; it continues on the next start).
//  4. On start, jobs the store says were RUNNING go back to the front of the queue; QUEUED jobs
//     stay queued in order, re-validated against today's files and limits; PAUSED jobs stay
//     paused. The engine resumes every run from the job's newest checkpoint, so a restarted or
//     resumed job continues where its last checkpoint left it (after SIGKILL: the steps since
//     that checkpoint are lost and redone).
//  5. ResumeJob puts a PAUSED job at the back of the queue. Checkpoint asks the running job for
//     a checkpoint after its current step and waits for that commit.
//  6. Provenance: the first phase of a job's first run (on the runner thread, after RUNNING) hashes
//     its inputs into its lineage, stored with the job. Every later run (a resume, a restart)
//     first re-hashes the data files: a file that differs from the lineage puts the job in
//     PAUSED with a message naming the file and both hashes (ResumeJob checks the same before
//     queueing and refuses). With ResumeJob's allow_data_change the run records the change as a
//     provenance::DataChange in the lineage instead. The engine gets the lineage and the
//     daemon's signer, so every checkpoint is signed and chained to the base model or seed
//     (the decisions: job_provenance_phase.h). Before that phase the inputs are checked again
//     as they are now (input_recheck.h): one that leads elsewhere or is no longer a regular
//     file fails the run naming it.
//  7. Every job event is appended to the store's hash-chained audit log (service/audit_log.h).
//  8. No priority inversion (request threads run at a low priority): request threads hold mu_,
//     which every step of the running job takes, only for O(jobs) reference counts and
//     lookups; List, Get and WaitForChange copy jobs from copy-on-write snapshots (SharedJob)
//     after releasing it, and Audit and Checkpoints read the store on a second SQLite
//     connection under their own lock.
//  9. A failed write of the state database (disk full, I/O error, locked) fails safe
//     (StoreWriter): the daemon turns unhealthy with the reason, refuses and starts no jobs, the
//     running job checkpoints and stops (QUEUED again, so it continues after a restart); a
//     submit whose row was not written is refused, never queued in memory only; audit rows that
//     could not be written stay pending, retried in order before later writes and at shutdown,
//     and are logged in full.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/common/input_files.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/signing_key.h"
#include "proto/job_state_name.h"
#include "proto/megatrain.pb.h"
#include "server/job_engine.h"
#include "server/job_history.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/shared_job.h"
#include "server/store_writer.h"
#include "server/structured_log.h"

namespace megatrain::server {

struct RunnerStatus {
  bool healthy = true;
  std::string unhealthy_reason;
  int queued = 0;
  std::string running_job_id;
  std::vector<DeviceState> devices;  // the engine's devices (JobEngine::Devices)
};

struct JobProvenanceOptions {
  std::shared_ptr<const provenance::SigningKey> signer;  // null: checkpoints are unsigned
  std::string device_kind;                               // recorded in each job's lineage
};

// Limits and test hooks of the runner (daemon settings).
// Eval-reply events a job holds for watchers that connect later (two rounds of eight prompts).
inline constexpr size_t kHeldEvalReplyEvents = 16;

struct RunnerLimits {
  // A job during whose runs megatraind stopped without a clean shutdown (crash, OOM kill,
  // SIGBUS, SIGKILL) this many times since its last checkpoint or resume is FAILED at the next
  // start instead of re-run ("quarantined"); counted from the store's audit rows.
  uint32_t max_job_crashes = 3;
  // Test hook (0 = off): a run that reaches this step of its job waits after every step from
  // there on until it is asked to stop (cancel, pause, shutdown) or for a checkpoint (it then
  // steps on until the checkpoint is committed). Lets tests interrupt a job at a known step
  // however fast the machine is. Runs that start past this step are not held.
  uint64_t test_hold_after_step = 0;
  // Test hook (empty = off): List, Audit and Checkpoints call it with their name where they copy
  // or read what they return. A test blocks in it until the running job steps on, which shows
  // that this part never holds the lock the job's steps take (issue 16, point 11).
  std::function<void(const char* call)> test_read_hook;
  // Test hook (empty = off): called with the job id once the job's inputs were checked and
  // opened for its run, before anything reads them. A test swaps an input there and shows that
  // the run reads what was checked (issue 16, point 2).
  std::function<void(const std::string& id)> test_after_input_check;
};

class JobRunner {
 public:
  using Revalidate = std::function<absl::StatusOr<service::ValidatedJob>(const v1::JobSpec&)>;

  // Loads the store (restart semantics above). `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<JobRunner>> Create(
      std::unique_ptr<JobStore> store, JobEngine& engine, DaemonMetrics* metrics,
      StructuredLog& log, uint32_t max_queue_length, const Revalidate& revalidate,
      JobProvenanceOptions provenance = {}, RunnerLimits limits = {});
  ~JobRunner();  // Shutdown()

  void Start();

  // `submitter_uid`: the Unix-socket caller, recorded in the job (unset: TCP).
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, service::ValidatedJob job,
                                 std::optional<uint32_t> submitter_uid = std::nullopt);
  // Appends an "access_refused" row to the job's audit chain and logs it.
  void RecordAccessRefusal(const std::string& id, const std::string& message);
  absl::StatusOr<v1::Job> Get(const std::string& id) const;
  std::vector<v1::Job> List(const std::vector<v1::JobState>& states) const;
  // One page of List: at most `limit` jobs submitted after `after_sequence` (0 = from the
  // first); `*next_after` is the last returned job's sequence when more follow, else 0.
  std::vector<v1::Job> ListPage(const std::vector<v1::JobState>& states, int64_t after_sequence,
                                size_t limit, int64_t* next_after) const;
  // Removes ended jobs (SUCCEEDED, FAILED, CANCELLED) that finished before the time from memory
  // and the store (their audit rows stay, with a "purged" row appended); returns their ids.
  absl::StatusOr<std::vector<std::string>> Purge(int64_t finished_before_unix_ms);
  absl::StatusOr<v1::Job> Cancel(const std::string& id);
  // QUEUED -> PAUSED at once; RUNNING -> checkpoint, stop, PAUSED (returns while it stops).
  absl::StatusOr<v1::Job> Pause(const std::string& id);
  // PAUSED -> QUEUED (re-validated first when it was paused before a restart). The data files
  // are re-hashed first (with the lock released): a change is FAILED_PRECONDITION naming the
  // file and both hashes unless `allow_data_change`, which lets the next run record it.
  absl::StatusOr<v1::Job> Resume(const std::string& id, bool allow_data_change = false);
  // The job's audit rows and the check of their chain. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::AuditLog> Audit(const std::string& id) const;
  // The job's lineage once its first run hashed it; NOT_FOUND before that or for an unknown id.
  absl::StatusOr<provenance::Lineage> JobLineage(const std::string& id) const;
  // Asks the running job for a checkpoint now and waits up to `timeout` for its commit.
  // FAILED_PRECONDITION when the job is not running or ends without one; DEADLINE_EXCEEDED.
  absl::StatusOr<v1::CheckpointRecord> CheckpointNow(const std::string& id, absl::Duration timeout);
  absl::StatusOr<std::vector<v1::CheckpointRecord>> Checkpoints(const std::string& id) const;
  // The job's step history in this daemon run (job_history.h; empty before its first step
  // here). NOT_FOUND for an unknown id. Never takes the lock the job's steps take.
  absl::StatusOr<v1::JobHistory> History(const std::string& id) const;
  RunnerStatus Status() const;

  // Blocks until the job changed after `*version` (0 = return at once), the timeout passed or
  // the runner is stopping. Fills `job`, `message` (latest event) and `*version`; NOT_FOUND for
  // an unknown id. Returns false on timeout/stop without a change.
  absl::StatusOr<bool> WaitForChange(const std::string& id, uint64_t* version,
                                     absl::Duration timeout, v1::Job* job,
                                     std::string* message) const;

  // The job's eval-reply events (data.eval_prompts) after `*cursor` (0: every one still held,
  // the latest kHeldEvalReplyEvents), oldest first; `*cursor` then counts those delivered. A
  // watcher calls it after each WaitForChange, so replies that come in a burst between two
  // wakes are each seen, not only the latest message. Empty for an unknown job.
  std::vector<v1::ProgressEvent> EvalReplyEventsSince(const std::string& id,
                                                      uint64_t* cursor) const;

  // Blocks until any job changed (a step, a state, a message, a submit, a purge) since
  // `*generation` (0 = return at once) or the timeout passed; `*generation` is then the runner's
  // current one. True on a change, false on timeout; UNAVAILABLE once the runner is stopping.
  // The dashboard's event streams wait here (the step observer's notifications, no timer).
  absl::StatusOr<bool> WaitForAnyChange(uint64_t* generation, absl::Duration timeout) const;

  // Stops taking jobs, asks the running job to stop (it goes back to QUEUED) and joins the runner
  // thread. Returns false when the run did not stop within `timeout` (the thread is detached).
  bool Shutdown(absl::Duration timeout = absl::Seconds(60));

 private:
  struct Entry {
    int64_t sequence = 0;
    SharedJob job;  // copy-on-write: readers snapshot it under mu_ and copy it after
    std::optional<service::ValidatedJob> validated;
    uint64_t version = 1;
    std::string message;
    int64_t last_persist_ms = 0;
    uint64_t checkpoints_committed = 0;  // this daemon run
    v1::CheckpointRecord last_checkpoint;
    std::optional<provenance::Lineage> lineage;  // set by the first run's provenance phase
    bool allow_data_change = false;              // ResumeJob's allowance, for the next run
    // The latest eval-reply events (at most kHeldEvalReplyEvents) and how many there were.
    std::deque<v1::ProgressEvent> eval_reply_events;
    uint64_t eval_reply_events_total = 0;
  };
  class StepObserver;

  JobRunner(std::unique_ptr<JobStore> store, std::unique_ptr<JobStore> reader, JobEngine& engine,
            DaemonMetrics* metrics, StructuredLog& log, uint32_t max_queue_length,
            Revalidate revalidate, JobProvenanceOptions provenance, RunnerLimits limits)
      : store_(std::move(store)),
        reader_(std::move(reader)),
        engine_(engine),
        metrics_(metrics),
        log_(log),
        max_queue_length_(max_queue_length),
        revalidate_(std::move(revalidate)),
        provenance_(std::move(provenance)),
        limits_(limits),
        writer_(*store_, log_, [this](const std::string& failure) { StoreFailedLocked(failure); }) {
  }

  // With mu_ held: how many times the daemon stopped uncleanly while `id` ran, since the job's
  // last checkpoint or resume (audit rows "requeued_after_restart").
  int CrashesSinceProgressLocked(const std::string& id);

  void Loop();
  // The provenance phase of a run (protocol 6), on the runner thread: the inputs are checked
  // and opened into `*inputs` first; DecideProvenance (job_provenance_phase.h) hashes them
  // without mu_, and what it decides (the lineage, audit rows) is stored under mu_. Returns the
  // job as the engine runs it (lineage, signer), reading through `*inputs`, so the caller keeps
  // them alive until the run ends. `*refusal` is set (and nothing returned) when changed data
  // keeps the job from continuing; an error fails the job.
  absl::StatusOr<service::ValidatedJob> PrepareRun(const std::string& id,
                                                   const service::ValidatedJob& validated,
                                                   std::string* refusal,
                                                   engine::InputFiles* inputs);
  // With mu_ held: persists the job and an event, appends `audit_kind` to the audit log, bumps
  // its version, wakes watchers.
  void TransitionLocked(Entry& entry, v1::JobState state, const std::string& message,
                        const char* audit_kind);
  // With mu_ held: appends one audit row (errors are logged).
  void AuditLocked(const std::string& id, const std::string& kind, const std::string& message);
  void PersistLocked(Entry& entry);
  // With mu_ held, once, from the write that failed first (protocol 9).
  void StoreFailedLocked(const std::string& failure);
  // With mu_ held: OK when no other job uses `job`'s resolved output directory (a finished one
  // may, with spec.reuse_output_dir); FAILED_PRECONDITION naming output_dir and the job.
  absl::Status CheckOutputDirFreeLocked(const v1::JobSpec& spec,
                                        const service::ValidatedJob& job) const;
  void PublishCountsLocked();
  // With mu_ held: a job changed; wakes WaitForChange and WaitForAnyChange.
  void NotifyChangedLocked() {
    ++generation_;
    changed_.notify_all();
  }
  const Entry* FindLocked(const std::string& id) const;
  bool Known(const std::string& id) const;  // takes mu_

  std::unique_ptr<JobStore> store_;  // writes and startup reads, under mu_
  mutable std::mutex reader_mu_;
  const std::unique_ptr<JobStore> reader_;  // request threads' reads, under reader_mu_ only
  JobEngine& engine_;
  DaemonMetrics* metrics_;
  StructuredLog& log_;
  const uint32_t max_queue_length_;
  const Revalidate revalidate_;
  const JobProvenanceOptions provenance_;
  const RunnerLimits limits_;
  StoreWriter writer_;      // every write of store_ (under mu_)
  JobHistories histories_;  // fed by the step observer; thread-safe on its own

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  uint64_t generation_ = 1;  // bumped with every notification of changed_; guarded by mu_
  std::map<std::string, Entry> jobs_;
  std::deque<std::string> queue_;
  std::string running_;
  int64_t next_sequence_ = 1;
  bool healthy_ = true;
  std::string unhealthy_reason_;
  bool stopping_ = false;
  std::atomic<bool> cancel_running_{false};
  std::atomic<bool> stop_running_{false};
  std::atomic<bool> pause_running_{false};
  std::atomic<bool> checkpoint_requested_{false};
  uint64_t checkpoint_request_step_ = 0;  // guarded by mu_
  int checkpoint_waiters_ = 0;            // CheckpointNow calls waiting; guarded by mu_
  std::thread thread_;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool loop_done_ = false;
};

}  // namespace megatrain::server
