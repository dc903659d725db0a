// Tests of the provenance phase's decisions: a first run builds the lineage to record, a later
// run with unchanged data records nothing, changed data refuses the run naming the resume that
// allows it, and an allowed change is recorded with one audit row a file.
#include "server/job_provenance_phase.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/test_files.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

service::ValidatedJob TextJob(const std::string& text_path) {
  service::ValidatedJob job;
  job.options.text_paths = {text_path};
  return job;
}

TEST(JobProvenancePhaseTest, FirstRunRecordsANewLineage) {
  const std::string dir = TempDir("phase_first");
  Write(dir + "/a.txt", "aa");
  absl::StatusOr<ProvenanceDecision> d =
      DecideProvenance("job-1", v1::JobSpec(), TextJob(dir + "/a.txt"), std::nullopt, false, "cpu");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->refusal.empty());
  EXPECT_TRUE(d->record);
  ASSERT_EQ(d->lineage.inputs.size(), 1u);
  EXPECT_EQ(d->lineage.device_kind, "cpu");
  ASSERT_EQ(d->audit.size(), 1u);
  EXPECT_EQ(d->audit[0].kind, "lineage_recorded");
  EXPECT_THAT(d->audit[0].message, HasSubstr("1 input files (2 bytes) hashed"));
  EXPECT_EQ(d->allowed_changes, 0u);
}

TEST(JobProvenancePhaseTest, ChangedDataRefusesUnlessAllowed) {
  const std::string dir = TempDir("phase_changed");
  Write(dir + "/a.txt", "aa");
  const service::ValidatedJob job = TextJob(dir + "/a.txt");
  absl::StatusOr<ProvenanceDecision> first =
      DecideProvenance("job-2", v1::JobSpec(), job, std::nullopt, false, "cpu");
  ASSERT_TRUE(first.ok()) << first.status();

  absl::StatusOr<ProvenanceDecision> same =
      DecideProvenance("job-2", v1::JobSpec(), job, first->lineage, false, "cpu");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->refusal.empty());
  EXPECT_FALSE(same->record);

  Write(dir + "/a.txt", "changed");
  absl::StatusOr<ProvenanceDecision> refused =
      DecideProvenance("job-2", v1::JobSpec(), job, first->lineage, false, "cpu");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_THAT(refused->refusal, HasSubstr("megatrain resume job-2 --allow-data-change"));
  EXPECT_FALSE(refused->record);

  absl::StatusOr<ProvenanceDecision> allowed =
      DecideProvenance("job-2", v1::JobSpec(), job, first->lineage, true, "cpu");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(allowed->refusal.empty());
  EXPECT_TRUE(allowed->record);
  EXPECT_EQ(allowed->allowed_changes, 1u);
  ASSERT_EQ(allowed->lineage.data_changes.size(), 1u);
  EXPECT_EQ(allowed->lineage.data_changes[0].reason, "megatrain resume --allow-data-change");
  ASSERT_EQ(allowed->audit.size(), 1u);
  EXPECT_EQ(allowed->audit[0].kind, "data_change_allowed");

  const service::ValidatedJob run = WithProvenance(job, allowed->lineage, nullptr);
  EXPECT_TRUE(run.options.allow_changed_data_files);
  EXPECT_EQ(run.options.lineage->data_changes.size(), 1u);
}

TEST(JobProvenancePhaseTest, UnreadableDataRefusesUntilItIsBack) {
  const std::string dir = TempDir("phase_gone");
  Write(dir + "/a.txt", "aa");
  const service::ValidatedJob job = TextJob(dir + "/a.txt");
  absl::StatusOr<ProvenanceDecision> first =
      DecideProvenance("job-3", v1::JobSpec(), job, std::nullopt, false, "cpu");
  ASSERT_TRUE(first.ok()) << first.status();
  std::filesystem::remove(dir + "/a.txt");
  absl::StatusOr<ProvenanceDecision> refused =
      DecideProvenance("job-3", v1::JobSpec(), job, first->lineage, true, "cpu");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_THAT(refused->refusal, HasSubstr("data check before continuing"));
  EXPECT_THAT(refused->refusal, HasSubstr("PAUSED until the data is back"));
}

}  // namespace
}  // namespace megatrain::server
