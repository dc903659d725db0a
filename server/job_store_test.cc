// Tests of the SQLite job store: round trips, ordering, schema version refusal, migration 1 -> 2.
#include "server/job_store.h"

#include <sqlite3.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

std::string TempDb(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(JobStoreTest, JobsEventsAndCheckpointsSurviveReopen) {
  const std::string path = TempDb("store_roundtrip.db");
  std::remove(path.c_str());
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job second;
    second.set_id("job-000002");
    second.set_state(v1::QUEUED);
    v1::Job first;
    first.set_id("job-000001");
    first.set_state(v1::RUNNING);
    first.mutable_spec()->mutable_hyper()->set_steps(17);
    ASSERT_TRUE((*store)->PutJob(2, second).ok());
    ASSERT_TRUE((*store)->PutJob(1, first).ok());
    first.set_state(v1::SUCCEEDED);
    ASSERT_TRUE((*store)->PutJob(1, first).ok());  // replace
    v1::ProgressEvent event;
    event.set_job_id("job-000001");
    event.set_message("started");
    ASSERT_TRUE((*store)->AppendEvent(event).ok());
    v1::CheckpointRecord record;
    record.set_job_id("job-000001");
    record.set_step(5);
    record.set_path("/out/step-5");
    ASSERT_TRUE((*store)->PutCheckpoint(record).ok());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<JobStore::StoredJob>> jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job.id(), "job-000001");
  EXPECT_EQ((*jobs)[0].job.state(), v1::SUCCEEDED);
  EXPECT_EQ((*jobs)[0].job.spec().hyper().steps(), 17u);
  EXPECT_EQ((*jobs)[1].sequence, 2);
  EXPECT_EQ((*store)->LoadEvents("job-000001")->size(), 1u);
  ASSERT_EQ((*store)->LoadCheckpoints("job-000001")->size(), 1u);
  EXPECT_EQ((*store)->LoadCheckpoints("job-000001")->front().path(), "/out/step-5");
}

TEST(JobStoreTest, RefusesAnotherSchemaVersion) {
  const std::string path = TempDb("store_version.db");
  std::remove(path.c_str());
  ASSERT_TRUE(JobStore::Open(path).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value = 99 WHERE key = 'schema_version';", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), ::testing::HasSubstr("schema version 99"));
}

TEST(JobStoreTest, MigratesVersion1KeepingItsRows) {
  const std::string path = TempDb("store_v1.db");
  std::remove(path.c_str());
  v1::Job job;
  job.set_id("job-000001");
  job.set_state(v1::PAUSED);
  const std::string blob = job.SerializeAsString();
  {
    // The version-1 schema exactly as version-1 builds created it.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(
                  db,
                  "PRAGMA journal_mode=WAL;"
                  "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER);"
                  "CREATE TABLE jobs (id TEXT PRIMARY KEY, sequence INTEGER NOT NULL, state "
                  "INTEGER NOT NULL, job BLOB NOT NULL);"
                  "CREATE TABLE events (rowid INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT "
                  "NULL, event BLOB NOT NULL);"
                  "CREATE INDEX events_by_job ON events(job_id);"
                  "CREATE TABLE checkpoints (job_id TEXT NOT NULL, step INTEGER NOT NULL, record "
                  "BLOB NOT NULL, PRIMARY KEY (job_id, step));"
                  "INSERT INTO meta VALUES ('schema_version', 1);",
                  nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_stmt* put = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "INSERT INTO jobs VALUES ('job-000001', 1, 3, ?);", -1, &put,
                                 nullptr),
              SQLITE_OK);
    sqlite3_bind_blob(put, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(put), SQLITE_DONE);
    sqlite3_finalize(put);
    sqlite3_close(db);
  }
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<std::vector<JobStore::StoredJob>> jobs = (*store)->LoadJobs();
    ASSERT_TRUE(jobs.ok());
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].job.state(), v1::PAUSED);
    ASSERT_TRUE((*store)->PutLineage("job-000001", "{\"x\": 1}").ok());
    ASSERT_TRUE((*store)->AppendAudit("job-000001", 5, "resume", "after migration").ok());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);  // now version 2
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->LoadLineages()->at("job-000001"), "{\"x\": 1}");
  EXPECT_EQ((*store)->LoadAudit("job-000001")->size(), 1u);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* get = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version';", -1, &get,
                               nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(get), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(get, 0), kJobStoreSchemaVersion);
  sqlite3_finalize(get);
  sqlite3_close(db);
}

}  // namespace
}  // namespace megatrain::server
