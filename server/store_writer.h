// StoreWriter: the job runner's writes to its JobStore, failing safe (issue 16, point 10). The
// first failed write is remembered (failure()) and reported once to the owner, which stops
// taking and starting jobs; a job row that could not be written stays dirty and an audit row
// pending (logged in full, never dropped silently), both retried in order before every later
// write and by Flush.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "proto/megatrain.pb.h"
#include "server/job_store.h"
#include "server/structured_log.h"

namespace megatrain::server {

class StoreWriter {
 public:
  using OnFirstFailure = std::function<void(const std::string& failure)>;

  // Not thread-safe, like JobStore: the owner serialises calls. `on_first_failure` is called
  // once, from inside the write that failed first.
  StoreWriter(JobStore& store, StructuredLog& log, OnFirstFailure on_first_failure)
      : store_(store), log_(log), on_first_failure_(std::move(on_first_failure)) {}
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  absl::Status PutJob(int64_t sequence, const v1::Job& job);
  // A new job's first row: on failure it is not kept for a retry (the caller refuses the job).
  absl::Status InsertJob(int64_t sequence, const v1::Job& job);
  absl::Status AppendEvent(const v1::ProgressEvent& event);
  absl::Status PutCheckpoint(const v1::CheckpointRecord& record);
  absl::Status PutLineage(const std::string& job_id, const std::string& lineage_json);
  absl::Status PurgeJob(const std::string& job_id, int64_t sequence);
  // Queues the row behind the pending ones and writes what it can, in order; a row that cannot
  // be written now is logged as `audit_row_pending` with its content and retried later.
  absl::Status AppendAudit(const std::string& job_id, int64_t unix_ms, const std::string& kind,
                           const std::string& message);
  // Retries dirty job rows and pending audit rows. With `final` (shutdown), rows still not
  // written are logged once more as `audit_row_unwritten` (the journal then holds them).
  absl::Status Flush(bool final = false);

  // "<what>: <error>" of the first failed write; empty while every write succeeded.
  const std::string& failure() const { return failure_; }
  size_t pending_audit_rows() const { return pending_audit_.size(); }

 private:
  struct AuditPending {
    std::string job_id;
    int64_t unix_ms = 0;
    std::string kind;
    std::string message;
  };
  absl::Status Failed(const std::string& what, absl::string_view job_id, absl::Status status);
  absl::Status FlushDirtyJobs();
  absl::Status FlushAudit();

  JobStore& store_;
  StructuredLog& log_;
  const OnFirstFailure on_first_failure_;
  std::string failure_;
  std::map<std::string, std::pair<int64_t, v1::Job>> dirty_jobs_;  // by id: sequence, job
  std::deque<AuditPending> pending_audit_;
};

}  // namespace megatrain::server
