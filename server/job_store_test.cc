// Tests of the SQLite job store: round trips, ordering, schema version refusal.
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

}  // namespace
}  // namespace megatrain::server
