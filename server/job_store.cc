// JobStore on SQLite (see job_store.h).
#include "server/job_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"

namespace megatrain::server {
namespace {

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status prepared() const {
    return rc_ == SQLITE_OK
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  // SQLITE_ROW, SQLITE_DONE, or an error code.
  int Step() { return sqlite3_step(stmt_); }
  absl::Status Done() {
    const int rc = Step();
    return rc == SQLITE_DONE ? absl::OkStatus()
                             : absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Connect(const std::string& path, int flags,
                                                            const char* what) {
  sqlite3* db = nullptr;
  if (path.empty() || sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "no database file or out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", what, " '", path, "': ", message));
  }
  sqlite3_busy_timeout(db, 5000);
  return std::unique_ptr<JobStore>(new JobStore(db));
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<JobStore>> opened =
      Connect(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "state database");
  if (!opened.ok()) return opened.status();
  std::unique_ptr<JobStore> store = *std::move(opened);
  sqlite3* db = store->db_;
  for (const char* sql :
       {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=NORMAL;",
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);"}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) return s;
  }
  constexpr char kVersion2Tables[] =
      "CREATE TABLE lineage (job_id TEXT PRIMARY KEY, lineage TEXT NOT NULL);";
  {
    Statement get(db, "SELECT value FROM meta WHERE key = 'schema_version';");
    if (absl::Status s = get.prepared(); !s.ok()) return s;
    if (get.Step() == SQLITE_ROW) {
      const int64_t version = get.Int(0);
      if (version == 1) {
        // Version 1 lacks the lineage and audit tables; its rows stay as they are.
        const std::string migrate =
            absl::StrCat("BEGIN IMMEDIATE;", kVersion2Tables, service::kAuditSchemaSql,
                         "UPDATE meta SET value = 2 WHERE key = 'schema_version';COMMIT;");
        if (absl::Status s = store->Exec(migrate.c_str()); !s.ok()) {
          (void)store->Exec("ROLLBACK;");
          return absl::Status(s.code(), absl::StrCat("state database '", path,
                                                     "': migration 1 -> 2: ", s.message()));
        }
        return store;
      }
      if (version != kJobStoreSchemaVersion) {
        return absl::FailedPreconditionError(
            absl::StrCat("state database '", path, "' has schema version ", version,
                         "; this build reads ", kJobStoreSchemaVersion, " (no migration known)"));
      }
      return store;
    }
  }
  const std::string create = absl::StrCat(
      "BEGIN;"
      "CREATE TABLE jobs (id TEXT PRIMARY KEY, sequence INTEGER NOT NULL, state INTEGER NOT "
      "NULL, job BLOB NOT NULL);"
      "CREATE TABLE events (rowid INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, "
      "event BLOB NOT NULL);"
      "CREATE INDEX events_by_job ON events(job_id);"
      "CREATE TABLE checkpoints (job_id TEXT NOT NULL, step INTEGER NOT NULL, record BLOB NOT "
      "NULL, PRIMARY KEY (job_id, step));",
      kVersion2Tables, service::kAuditSchemaSql, "INSERT INTO meta VALUES ('schema_version', ",
      kJobStoreSchemaVersion, ");COMMIT;");
  if (absl::Status s = store->Exec(create.c_str()); !s.ok()) return s;
  return store;
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::OpenReader() const {
  const char* file = sqlite3_db_filename(db_, "main");
  absl::StatusOr<std::unique_ptr<JobStore>> reader =
      Connect(file != nullptr ? file : "", SQLITE_OPEN_READWRITE, "a reader of state database");
  if (!reader.ok()) return reader.status();
  if (absl::Status s = (*reader)->Exec("PRAGMA query_only=1;"); !s.ok()) return s;
  return reader;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", error ? error : "?"));
    sqlite3_free(error);
    return s;
  }
  return absl::OkStatus();
}

absl::Status JobStore::PutJob(int64_t sequence, const v1::Job& job) {
  Statement put(db_, "INSERT OR REPLACE INTO jobs (id, sequence, state, job) VALUES (?, ?, ?, ?);");
  if (absl::Status s = put.prepared(); !s.ok()) return s;
  put.Bind(1, job.id());
  put.Bind(2, sequence);
  put.Bind(3, static_cast<int64_t>(job.state()));
  put.Bind(4, job.SerializeAsString());
  return put.Done();
}

absl::Status JobStore::AppendEvent(const v1::ProgressEvent& event) {
  Statement put(db_, "INSERT INTO events (job_id, event) VALUES (?, ?);");
  if (absl::Status s = put.prepared(); !s.ok()) return s;
  put.Bind(1, event.job_id());
  put.Bind(2, event.SerializeAsString());
  return put.Done();
}

absl::Status JobStore::PutCheckpoint(const v1::CheckpointRecord& record) {
  Statement put(db_, "INSERT OR REPLACE INTO checkpoints (job_id, step, record) VALUES (?, ?, ?);");
  if (absl::Status s = put.prepared(); !s.ok()) return s;
  put.Bind(1, record.job_id());
  put.Bind(2, static_cast<int64_t>(record.step()));
  put.Bind(3, record.SerializeAsString());
  return put.Done();
}

absl::Status JobStore::PutLineage(const std::string& job_id, const std::string& lineage_json) {
  Statement put(db_, "INSERT OR REPLACE INTO lineage (job_id, lineage) VALUES (?, ?);");
  if (absl::Status s = put.prepared(); !s.ok()) return s;
  put.Bind(1, job_id);
  put.Bind(2, lineage_json);
  return put.Done();
}

absl::Status JobStore::PurgeJob(const std::string& job_id, int64_t sequence) {
  if (absl::Status s = Exec("BEGIN IMMEDIATE;"); !s.ok()) return s;
  auto run = [&]() -> absl::Status {
    for (const char* sql :
         {"DELETE FROM jobs WHERE id = ?;", "DELETE FROM events WHERE job_id = ?;",
          "DELETE FROM checkpoints WHERE job_id = ?;", "DELETE FROM lineage WHERE job_id = ?;"}) {
      Statement del(db_, sql);
      if (absl::Status s = del.prepared(); !s.ok()) return s;
      del.Bind(1, job_id);
      if (absl::Status s = del.Done(); !s.ok()) return s;
    }
    Statement mark(db_,
                   "INSERT INTO meta (key, value) VALUES ('max_purged_sequence', ?) "
                   "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value);");
    if (absl::Status s = mark.prepared(); !s.ok()) return s;
    mark.Bind(1, sequence);
    return mark.Done();
  };
  if (absl::Status s = run(); !s.ok()) {
    (void)Exec("ROLLBACK;");
    return s;
  }
  return Exec("COMMIT;");
}

absl::StatusOr<int64_t> JobStore::LoadMaxPurgedSequence() {
  Statement get(db_, "SELECT value FROM meta WHERE key = 'max_purged_sequence';");
  if (absl::Status s = get.prepared(); !s.ok()) return s;
  return get.Step() == SQLITE_ROW ? get.Int(0) : 0;
}

absl::StatusOr<service::AuditRow> JobStore::AppendAudit(const std::string& job_id, int64_t unix_ms,
                                                        const std::string& kind,
                                                        const std::string& message) {
  return service::AppendAuditRow(db_, job_id, unix_ms, kind, message);
}

absl::StatusOr<std::map<std::string, std::string>> JobStore::LoadLineages() {
  Statement get(db_, "SELECT job_id, lineage FROM lineage;");
  if (absl::Status s = get.prepared(); !s.ok()) return s;
  std::map<std::string, std::string> lineages;
  while (get.Step() == SQLITE_ROW) lineages[get.Blob(0)] = get.Blob(1);
  return lineages;
}

absl::StatusOr<std::vector<service::AuditRow>> JobStore::LoadAudit(const std::string& job_id) {
  return service::ReadAuditRows(db_, job_id);
}

absl::StatusOr<std::vector<JobStore::StoredJob>> JobStore::LoadJobs() {
  Statement get(db_, "SELECT sequence, job FROM jobs ORDER BY sequence;");
  if (absl::Status s = get.prepared(); !s.ok()) return s;
  std::vector<StoredJob> jobs;
  int rc;
  while ((rc = get.Step()) == SQLITE_ROW) {
    StoredJob stored;
    stored.sequence = get.Int(0);
    if (!stored.job.ParseFromString(get.Blob(1))) {
      return absl::DataLossError(
          absl::StrCat("state database: job row ", stored.sequence, " does not parse"));
    }
    jobs.push_back(std::move(stored));
  }
  if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return jobs;
}

absl::StatusOr<std::vector<v1::ProgressEvent>> JobStore::LoadEvents(const std::string& job_id) {
  Statement get(db_, "SELECT event FROM events WHERE job_id = ? ORDER BY rowid;");
  if (absl::Status s = get.prepared(); !s.ok()) return s;
  get.Bind(1, job_id);
  std::vector<v1::ProgressEvent> events;
  while (get.Step() == SQLITE_ROW) {
    events.emplace_back();
    if (!events.back().ParseFromString(get.Blob(0))) {
      return absl::DataLossError("state database: an event does not parse");
    }
  }
  return events;
}

absl::StatusOr<std::vector<v1::CheckpointRecord>> JobStore::LoadCheckpoints(
    const std::string& job_id) {
  Statement get(db_, "SELECT record FROM checkpoints WHERE job_id = ? ORDER BY step;");
  if (absl::Status s = get.prepared(); !s.ok()) return s;
  get.Bind(1, job_id);
  std::vector<v1::CheckpointRecord> records;
  while (get.Step() == SQLITE_ROW) {
    records.emplace_back();
    if (!records.back().ParseFromString(get.Blob(0))) {
      return absl::DataLossError("state database: a checkpoint record does not parse");
    }
  }
  return records;
}

}  // namespace megatrain::server
