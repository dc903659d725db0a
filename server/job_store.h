// JobStore: the daemon's durable state in SQLite (WAL): job specs and states, events, checkpoint
// records, each job's provenance lineage and the audit log, under a versioned schema that is
// created, migrated (1 -> 2) or refused explicitly.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"
#include "service/audit_log.h"

struct sqlite3;

namespace megatrain::server {

// 1: jobs, events, checkpoints. 2: + lineage (per job) and audit (hash-chained events).
inline constexpr int kJobStoreSchemaVersion = 2;

// Not thread-safe: the owner serialises calls (the job runner holds its lock around them).
class JobStore {
 public:
  // Opens or creates `path`; a version-1 database is migrated to version 2 in one transaction.
  // A database with another schema version is FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  // A second connection to the same database for another thread's reads (WAL readers never
  // wait for the writer); it refuses writes (query_only).
  absl::StatusOr<std::unique_ptr<JobStore>> OpenReader() const;
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Insert or replace the job (by id); `sequence` orders the FIFO queue.
  absl::Status PutJob(int64_t sequence, const v1::Job& job);
  absl::Status AppendEvent(const v1::ProgressEvent& event);
  absl::Status PutCheckpoint(const v1::CheckpointRecord& record);
  // The job's lineage (provenance::LineageToJson text), inserted or replaced.
  absl::Status PutLineage(const std::string& job_id, const std::string& lineage_json);
  // Deletes the job's jobs, events, checkpoints and lineage rows in one transaction (its audit
  // rows stay: the audit log is append-only) and remembers `sequence` so that no later job gets
  // the purged job's id (LoadMaxPurgedSequence).
  absl::Status PurgeJob(const std::string& job_id, int64_t sequence);
  // The largest sequence of a purged job; 0 when none was purged.
  absl::StatusOr<int64_t> LoadMaxPurgedSequence();
  // Appends an event to the job's audit chain.
  absl::StatusOr<service::AuditRow> AppendAudit(const std::string& job_id, int64_t unix_ms,
                                                const std::string& kind,
                                                const std::string& message);

  struct StoredJob {
    int64_t sequence = 0;
    v1::Job job;
  };
  // Every job in submission order.
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();
  absl::StatusOr<std::vector<v1::ProgressEvent>> LoadEvents(const std::string& job_id);
  absl::StatusOr<std::vector<v1::CheckpointRecord>> LoadCheckpoints(const std::string& job_id);
  // Lineage JSON by job id.
  absl::StatusOr<std::map<std::string, std::string>> LoadLineages();
  absl::StatusOr<std::vector<service::AuditRow>> LoadAudit(const std::string& job_id);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  // One connection with the store's busy timeout; FAILED_PRECONDITION naming `what` and `path`.
  static absl::StatusOr<std::unique_ptr<JobStore>> Connect(const std::string& path, int flags,
                                                           const char* what);
  absl::Status Exec(const char* sql);

  sqlite3* db_;
};

}  // namespace megatrain::server
