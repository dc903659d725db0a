// StoreWriter (see store_writer.h).
#include "server/store_writer.h"

#include "absl/strings/str_cat.h"

namespace megatrain::server {

absl::Status StoreWriter::Failed(const std::string& what, absl::string_view job_id,
                                 absl::Status status) {
  log_.JobEvent("store_error", job_id, {{"write", what}, {"error", status.ToString()}});
  if (failure_.empty()) {
    failure_ = absl::StrCat(what, ": ", status.message());
    if (on_first_failure_) on_first_failure_(failure_);
  }
  return status;
}

absl::Status StoreWriter::FlushDirtyJobs() {
  for (auto it = dirty_jobs_.begin(); it != dirty_jobs_.end();) {
    const auto& [sequence, job] = it->second;
    if (absl::Status s = store_.PutJob(sequence, job); !s.ok()) {
      return Failed("jobs row (retry)", it->first, s);
    }
    it = dirty_jobs_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::FlushAudit() {
  while (!pending_audit_.empty()) {
    const AuditPending& row = pending_audit_.front();
    absl::StatusOr<service::AuditRow> written =
        store_.AppendAudit(row.job_id, row.unix_ms, row.kind, row.message);
    if (!written.ok()) return Failed("audit row", row.job_id, written.status());
    pending_audit_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::Flush(bool final) {
  absl::Status jobs = FlushDirtyJobs();
  absl::Status audit = FlushAudit();
  if (final) {
    for (const AuditPending& row : pending_audit_) {
      log_.JobEvent(
          "audit_row_unwritten", row.job_id,
          {{"unix_ms", absl::StrCat(row.unix_ms)}, {"kind", row.kind}, {"message", row.message}});
    }
  }
  return jobs.ok() ? audit : jobs;
}

absl::Status StoreWriter::PutJob(int64_t sequence, const v1::Job& job) {
  (void)Flush();
  if (absl::Status s = store_.PutJob(sequence, job); !s.ok()) {
    dirty_jobs_[job.id()] = {sequence, job};
    return Failed("jobs row", job.id(), s);
  }
  dirty_jobs_.erase(job.id());
  return absl::OkStatus();
}

absl::Status StoreWriter::InsertJob(int64_t sequence, const v1::Job& job) {
  (void)Flush();
  if (absl::Status s = store_.PutJob(sequence, job); !s.ok())
    return Failed("jobs row", job.id(), s);
  return absl::OkStatus();
}

absl::Status StoreWriter::AppendEvent(const v1::ProgressEvent& event) {
  if (absl::Status s = store_.AppendEvent(event); !s.ok()) {
    return Failed("events row", event.job_id(), s);
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::PutCheckpoint(const v1::CheckpointRecord& record) {
  if (absl::Status s = store_.PutCheckpoint(record); !s.ok()) {
    return Failed("checkpoints row", record.job_id(), s);
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::PutLineage(const std::string& job_id, const std::string& lineage_json) {
  if (absl::Status s = store_.PutLineage(job_id, lineage_json); !s.ok()) {
    return Failed("lineage row", job_id, s);
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::PurgeJob(const std::string& job_id, int64_t sequence) {
  (void)Flush();
  if (absl::Status s = store_.PurgeJob(job_id, sequence); !s.ok()) {
    return Failed("purge", job_id, s);
  }
  dirty_jobs_.erase(job_id);
  return absl::OkStatus();
}

absl::Status StoreWriter::AppendAudit(const std::string& job_id, int64_t unix_ms,
                                      const std::string& kind, const std::string& message) {
  (void)FlushDirtyJobs();
  pending_audit_.push_back({job_id, unix_ms, kind, message});
  absl::Status s = FlushAudit();
  if (!s.ok()) {
    log_.JobEvent("audit_row_pending", job_id,
                  {{"unix_ms", absl::StrCat(unix_ms)}, {"kind", kind}, {"message", message}});
  }
  return s;
}

}  // namespace megatrain::server
