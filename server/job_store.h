// JobStore: the daemon's durable state in SQLite (WAL): job specs and states, events, checkpoint
// records, under a versioned schema that is created, accepted or refused explicitly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"

struct sqlite3;

namespace megatrain::server {

inline constexpr int kJobStoreSchemaVersion = 1;

// Not thread-safe: the owner serialises calls (the job runner holds its lock around them).
class JobStore {
 public:
  // Opens or creates `path`. A database with another schema version is FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Insert or replace the job (by id); `sequence` orders the FIFO queue.
  absl::Status PutJob(int64_t sequence, const v1::Job& job);
  absl::Status AppendEvent(const v1::ProgressEvent& event);
  absl::Status PutCheckpoint(const v1::CheckpointRecord& record);

  struct StoredJob {
    int64_t sequence = 0;
    v1::Job job;
  };
  // Every job in submission order.
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();
  absl::StatusOr<std::vector<v1::ProgressEvent>> LoadEvents(const std::string& job_id);
  absl::StatusOr<std::vector<v1::CheckpointRecord>> LoadCheckpoints(const std::string& job_id);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);

  sqlite3* db_;
};

}  // namespace megatrain::server
