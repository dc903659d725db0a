// Tests of the audit log: the chain of appended rows checks, and altering, deleting or
// reordering a row is detected and named, in the store and through the offline file reader.
#include "service/audit_log.h"

#include <sqlite3.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_store.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

std::string TempDb(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return path;
}

// Runs SQL on the database file as an outside writer would (the sqlite3 CLI).
void Tamper(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

// Five events of job a interleaved with three of job b; returns the row id of a's seq 3.
int64_t WriteEvents(const std::string& path) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  int64_t row_of_a3 = 0;
  for (int i = 1; i <= 5; ++i) {
    absl::StatusOr<service::AuditRow> a = (*store)->AppendAudit(
        "job-a", 1000 + i, "kind", "event " + std::to_string(i) + " \xff\n odd bytes");
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->seq, i);
    if (i == 3) row_of_a3 = a->row;
    if (i <= 3) {
      EXPECT_TRUE((*store)->AppendAudit("job-b", 2000 + i, "other", "b").ok());
    }
  }
  return row_of_a3;
}

TEST(AuditLogTest, AppendedRowsChainAndCheck) {
  const std::string path = TempDb("audit_ok.db");
  WriteEvents(path);
  absl::StatusOr<std::vector<service::AuditRow>> rows = service::ReadAuditLogFile(path, "job-a");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 5u);
  EXPECT_EQ((*rows)[0].prev_hash, service::kAuditGenesisHash);
  for (size_t i = 1; i < rows->size(); ++i) EXPECT_EQ((*rows)[i].prev_hash, (*rows)[i - 1].hash);
  EXPECT_TRUE(service::CheckAuditChain(*rows).ok) << service::CheckAuditChain(*rows).problem;
  EXPECT_EQ(service::ReadAuditLogFile(path, "job-b")->size(), 3u);
  EXPECT_TRUE(service::ReadAuditLogFile(path, "job-none")->empty());
}

TEST(AuditLogTest, TableRefusesUpdatesAndDeletes) {
  const std::string path = TempDb("audit_triggers.db");
  WriteEvents(path);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  EXPECT_NE(sqlite3_exec(db, "UPDATE audit SET message = 'x';", nullptr, nullptr, nullptr),
            SQLITE_OK);
  EXPECT_NE(sqlite3_exec(db, "DELETE FROM audit;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
}

TEST(AuditLogTest, AlteredRowIsNamed) {
  const std::string path = TempDb("audit_altered.db");
  const int64_t row = WriteEvents(path);
  const std::string sql =
      "DROP TRIGGER audit_no_update; UPDATE audit SET message = 'forged' "
      "WHERE row = " +
      std::to_string(row) + ";";
  Tamper(path, sql.c_str());
  const service::AuditCheck check =
      service::CheckAuditChain(*service::ReadAuditLogFile(path, "job-a"));
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.first_bad_row, row);
  EXPECT_THAT(check.problem, HasSubstr("seq 3"));
  EXPECT_THAT(check.problem, HasSubstr("altered"));
  // The other job's chain is untouched.
  EXPECT_TRUE(service::CheckAuditChain(*service::ReadAuditLogFile(path, "job-b")).ok);
}

TEST(AuditLogTest, AlteredRowWithRecomputedHashBreaksTheNextRow) {
  const std::string path = TempDb("audit_rehashed.db");
  const int64_t row = WriteEvents(path);
  std::vector<service::AuditRow> rows = *service::ReadAuditLogFile(path, "job-a");
  service::AuditRow forged = rows[2];
  forged.unix_ms = 1;
  const std::string sql = "DROP TRIGGER audit_no_update; UPDATE audit SET unix_ms = 1, hash = '" +
                          service::AuditRowHash(forged) + "' WHERE row = " + std::to_string(row) +
                          ";";
  Tamper(path, sql.c_str());
  const service::AuditCheck check =
      service::CheckAuditChain(*service::ReadAuditLogFile(path, "job-a"));
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.first_bad_row, rows[3].row);
  EXPECT_THAT(check.problem, HasSubstr("prev_hash"));
}

TEST(AuditLogTest, DeletedRowIsNamedAtTheNextRow) {
  const std::string path = TempDb("audit_deleted.db");
  const int64_t row = WriteEvents(path);
  const std::vector<service::AuditRow> before = *service::ReadAuditLogFile(path, "job-a");
  const std::string sql =
      "DROP TRIGGER audit_no_delete; DELETE FROM audit WHERE row = " + std::to_string(row) + ";";
  Tamper(path, sql.c_str());
  const service::AuditCheck check =
      service::CheckAuditChain(*service::ReadAuditLogFile(path, "job-a"));
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.first_bad_row, before[3].row);
  EXPECT_THAT(check.problem, HasSubstr("seq 3 expected"));
  EXPECT_THAT(check.problem, HasSubstr("deleted"));
}

TEST(AuditLogTest, OfflineReaderErrorsNameTheFile) {
  EXPECT_EQ(service::ReadAuditLogFile("/nonexistent/megatrain.db", "j").status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = TempDb("audit_not_a_store.db");
  Tamper(path, "CREATE TABLE t (x);");
  absl::StatusOr<std::vector<service::AuditRow>> rows = service::ReadAuditLogFile(path, "j");
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rows.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace megatrain::server
