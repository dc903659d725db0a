// StoreWriter under a failing database: another connection holds the write lock, so writes
// fail (SQLITE_BUSY after the store's busy timeout); the first failure is reported once, the
// job row stays dirty and the audit rows pending, and both reach the database in order once
// the lock is gone, with the audit chain intact (issue 16, point 10).
#include "server/store_writer.h"

#include <sqlite3.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDb(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return path;
}

v1::Job MakeJob(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  return job;
}

TEST(StoreWriterTest, FailedWritesAreReportedOnceAndRetriedInOrder) {
  const std::string path = TempDb("store_writer.db");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  StructuredLog log(stderr);
  std::vector<std::string> failures;
  StoreWriter writer(**store, log, [&](const std::string& f) { failures.push_back(f); });
  ASSERT_TRUE(writer.PutJob(1, MakeJob("job-000001", v1::QUEUED)).ok());
  ASSERT_TRUE(writer.AppendAudit("job-000001", 1, "submit", "submitted").ok());
  EXPECT_TRUE(writer.failure().empty());

  sqlite3* locker = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &locker), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(locker, "BEGIN EXCLUSIVE;", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_FALSE(writer.AppendAudit("job-000001", 2, "start", "state RUNNING").ok());
  EXPECT_FALSE(writer.PutJob(1, MakeJob("job-000001", v1::RUNNING)).ok());
  EXPECT_FALSE(writer.InsertJob(2, MakeJob("job-000002", v1::QUEUED)).ok());
  EXPECT_EQ(writer.pending_audit_rows(), 1u);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("audit row"));
  EXPECT_THAT(failures[0], HasSubstr("locked"));
  ASSERT_EQ(sqlite3_exec(locker, "ROLLBACK;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(locker);

  // The next write first writes what is pending, in order; the refused new job never appears.
  ASSERT_TRUE(writer.AppendAudit("job-000001", 3, "completion", "state SUCCEEDED").ok());
  EXPECT_EQ(writer.pending_audit_rows(), 0u);
  EXPECT_EQ(failures.size(), 1u);
  EXPECT_FALSE(writer.failure().empty());  // sticky: the owner restarts to clear it
  absl::StatusOr<std::vector<service::AuditRow>> rows = (*store)->LoadAudit("job-000001");
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<std::string> kinds;
  for (const service::AuditRow& row : *rows) kinds.push_back(row.kind);
  EXPECT_THAT(kinds, ElementsAre("submit", "start", "completion"));
  EXPECT_TRUE(service::CheckedAuditLog(*rows).chain_ok());
  absl::StatusOr<std::vector<JobStore::StoredJob>> jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job.state(), v1::RUNNING);
}

}  // namespace
}  // namespace megatrain::server
