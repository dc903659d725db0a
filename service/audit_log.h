// The audit log: an append-only SQLite table of job events where each row carries the SHA-256 of
// the previous row of the same job and of its own content (a hash chain per job), its check, and
// a read-only reader of a database file for checking offline (a tampered daemon can't be trusted
// to check itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"

struct sqlite3;

namespace megatrain::service {

// The previous hash of a job's first row.
inline constexpr char kAuditGenesisHash[] =
    "0000000000000000000000000000000000000000000000000000000000000000";

// Created by the job store (schema version 2). The triggers keep accidental writers from
// changing rows; the hash chain is what detects a deliberate change.
inline constexpr char kAuditSchemaSql[] =
    "CREATE TABLE audit (row INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, "
    "seq INTEGER NOT NULL, unix_ms INTEGER NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL, "
    "prev_hash TEXT NOT NULL, hash TEXT NOT NULL, UNIQUE (job_id, seq));"
    "CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit "
    "BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;"
    "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit "
    "BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;";

struct AuditRow {
  int64_t row = 0;  // the table's row id; not hashed
  std::string job_id;
  int64_t seq = 0;  // 1, 2, ... within the job
  int64_t unix_ms = 0;
  std::string kind;
  std::string message;
  std::string prev_hash;  // hex
  std::string hash;       // hex
};

// SHA-256 hex over prev_hash and the row's content (job_id, seq, unix_ms, kind, message), each
// field length-prefixed so no two contents hash the same input.
std::string AuditRowHash(const AuditRow& row);

struct AuditCheck {
  bool ok = true;
  int64_t first_bad_row = 0;  // row id of the first row that fails (0 = none)
  std::string problem;        // names the row, its seq and what is wrong
};

// Checks a job's rows in seq order: seqs 1, 2, ... without gaps, each prev_hash equal to the
// previous row's hash (the genesis hash for seq 1) and each hash equal to AuditRowHash. A row
// altered in place fails its own hash; a deleted row breaks the seq and prev_hash of the next.
// Deleting the newest rows of a job is not detectable from the chain alone (see docs/daemon.md).
AuditCheck CheckAuditChain(const std::vector<AuditRow>& rows);

// The rows as the API's AuditLog, with the verdict of CheckAuditChain.
v1::AuditLog CheckedAuditLog(const std::vector<AuditRow>& rows);

// Appends an event for `job_id`, chained to the job's newest row. The caller serialises writers.
absl::StatusOr<AuditRow> AppendAuditRow(sqlite3* db, const std::string& job_id, int64_t unix_ms,
                                        const std::string& kind, const std::string& message);
// The job's rows in seq order (as stored, unchecked).
absl::StatusOr<std::vector<AuditRow>> ReadAuditRows(sqlite3* db, const std::string& job_id);
// Opens the database file read-only and reads the job's rows; NOT_FOUND for a missing file,
// FAILED_PRECONDITION for a database without an audit table.
absl::StatusOr<std::vector<AuditRow>> ReadAuditLogFile(const std::string& db_path,
                                                       const std::string& job_id);

}  // namespace megatrain::service
