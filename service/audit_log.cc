// The audit log's hash chain, append and read (see audit_log.h).
#include "service/audit_log.h"

#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/provenance/sha256.h"

namespace megatrain::service {
namespace {

void AppendField(std::string& out, const std::string& field) {
  absl::StrAppend(&out, field.size(), ":", field, ";");
}

std::string Text(sqlite3_stmt* stmt, int col) {
  const unsigned char* p = sqlite3_column_text(stmt, col);
  return p == nullptr ? std::string()
                      : std::string(reinterpret_cast<const char*>(p),
                                    static_cast<size_t>(sqlite3_column_bytes(stmt, col)));
}

absl::Status SqliteError(sqlite3* db, const char* what) {
  return absl::InternalError(absl::StrCat("audit log: ", what, ": ", sqlite3_errmsg(db)));
}

// A prepared statement that finalizes itself.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

void BindText(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
}

}  // namespace

std::string AuditRowHash(const AuditRow& row) {
  std::string content;
  AppendField(content, row.prev_hash);
  AppendField(content, row.job_id);
  AppendField(content, absl::StrCat(row.seq));
  AppendField(content, absl::StrCat(row.unix_ms));
  AppendField(content, row.kind);
  AppendField(content, row.message);
  return provenance::Sha256Hex(content);
}

AuditCheck CheckAuditChain(const std::vector<AuditRow>& rows) {
  AuditCheck check;
  std::string previous_hash = kAuditGenesisHash;
  int64_t expected_seq = 1;
  for (const AuditRow& row : rows) {
    auto bad = [&](const std::string& problem) {
      check.ok = false;
      check.first_bad_row = row.row;
      check.problem = absl::StrCat("row ", row.row, " (job ", row.job_id, " seq ", row.seq, ", ",
                                   row.kind, "): ", problem);
      return check;
    };
    if (row.seq != expected_seq) {
      return bad(row.seq > expected_seq
                     ? absl::StrCat("seq ", expected_seq, " expected; ", row.seq - expected_seq,
                                    " row(s) before it were deleted")
                     : absl::StrCat("seq ", expected_seq, " expected (duplicated or reordered)"));
    }
    if (row.prev_hash != previous_hash) {
      return bad(absl::StrCat("prev_hash ", row.prev_hash, " is not the previous row's hash ",
                              previous_hash, " (the previous row was altered or deleted)"));
    }
    const std::string hash = AuditRowHash(row);
    if (row.hash != hash) {
      return bad(absl::StrCat("content does not match its hash (stored ", row.hash, ", computed ",
                              hash, "): the row was altered"));
    }
    previous_hash = row.hash;
    ++expected_seq;
  }
  return check;
}

v1::AuditLog CheckedAuditLog(const std::vector<AuditRow>& rows) {
  v1::AuditLog log;
  for (const AuditRow& r : rows) {
    v1::AuditEntry* entry = log.add_entries();
    entry->set_row(r.row);
    entry->set_job_id(r.job_id);
    entry->set_seq(r.seq);
    entry->set_unix_ms(r.unix_ms);
    entry->set_kind(r.kind);
    entry->set_message(r.message);
    entry->set_prev_hash(r.prev_hash);
    entry->set_hash(r.hash);
  }
  const AuditCheck check = CheckAuditChain(rows);
  log.set_chain_ok(check.ok);
  log.set_first_bad_row(check.first_bad_row);
  log.set_problem(check.problem);
  return log;
}

absl::StatusOr<AuditRow> AppendAuditRow(sqlite3* db, const std::string& job_id, int64_t unix_ms,
                                        const std::string& kind, const std::string& message) {
  AuditRow row;
  row.job_id = job_id;
  row.unix_ms = unix_ms;
  row.kind = kind;
  row.message = message;
  row.seq = 1;
  row.prev_hash = kAuditGenesisHash;
  {
    Stmt last;
    if (sqlite3_prepare_v2(db,
                           "SELECT seq, hash FROM audit WHERE job_id = ? ORDER BY seq DESC "
                           "LIMIT 1;",
                           -1, &last.s, nullptr) != SQLITE_OK) {
      return SqliteError(db, "prepare");
    }
    BindText(last.s, 1, job_id);
    const int rc = sqlite3_step(last.s);
    if (rc == SQLITE_ROW) {
      row.seq = sqlite3_column_int64(last.s, 0) + 1;
      row.prev_hash = Text(last.s, 1);
    } else if (rc != SQLITE_DONE) {
      return SqliteError(db, "read");
    }
  }
  row.hash = AuditRowHash(row);
  Stmt put;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO audit (job_id, seq, unix_ms, kind, message, prev_hash, "
                         "hash) VALUES (?, ?, ?, ?, ?, ?, ?);",
                         -1, &put.s, nullptr) != SQLITE_OK) {
    return SqliteError(db, "prepare");
  }
  BindText(put.s, 1, row.job_id);
  sqlite3_bind_int64(put.s, 2, row.seq);
  sqlite3_bind_int64(put.s, 3, row.unix_ms);
  BindText(put.s, 4, row.kind);
  BindText(put.s, 5, row.message);
  BindText(put.s, 6, row.prev_hash);
  BindText(put.s, 7, row.hash);
  if (sqlite3_step(put.s) != SQLITE_DONE) return SqliteError(db, "append");
  row.row = sqlite3_last_insert_rowid(db);
  return row;
}

absl::StatusOr<std::vector<AuditRow>> ReadAuditRows(sqlite3* db, const std::string& job_id) {
  Stmt get;
  if (sqlite3_prepare_v2(db,
                         "SELECT row, job_id, seq, unix_ms, kind, message, prev_hash, hash FROM "
                         "audit WHERE job_id = ? ORDER BY seq, row;",
                         -1, &get.s, nullptr) != SQLITE_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("audit log: cannot read the audit table: ", sqlite3_errmsg(db)));
  }
  BindText(get.s, 1, job_id);
  std::vector<AuditRow> rows;
  int rc;
  while ((rc = sqlite3_step(get.s)) == SQLITE_ROW) {
    AuditRow r;
    r.row = sqlite3_column_int64(get.s, 0);
    r.job_id = Text(get.s, 1);
    r.seq = sqlite3_column_int64(get.s, 2);
    r.unix_ms = sqlite3_column_int64(get.s, 3);
    r.kind = Text(get.s, 4);
    r.message = Text(get.s, 5);
    r.prev_hash = Text(get.s, 6);
    r.hash = Text(get.s, 7);
    rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqliteError(db, "read");
  return rows;
}

absl::StatusOr<std::vector<AuditRow>> ReadAuditLogFile(const std::string& db_path,
                                                       const std::string& job_id) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(db_path, ec)) {
    return absl::NotFoundError(absl::StrCat("--db: '", db_path, "' is not a file"));
  }
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  struct Closer {
    sqlite3* db;
    ~Closer() { sqlite3_close(db); }
  } closer{db};
  if (rc != SQLITE_OK) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--db: cannot open '", db_path, "': ", db ? sqlite3_errmsg(db) : "out of memory"));
  }
  sqlite3_busy_timeout(db, 5000);
  absl::StatusOr<std::vector<AuditRow>> rows = ReadAuditRows(db, job_id);
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        absl::StrCat("--db '", db_path, "': ", rows.status().message()));
  }
  return rows;
}

}  // namespace megatrain::service
