// Tests of job lineage: every input hashed with its role, the spec and device recorded, and the
// data comparison before a continued run (changed, new, gone files; allowed changes count).
#include "server/job_lineage.h"

#include <filesystem>
#include <string>

#include "engine/provenance/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/test_files.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

TEST(JobLineageTest, HashesEveryInputWithItsRole) {
  const std::string dir = TempDir("lineage_inputs");
  std::filesystem::create_directories(dir + "/model");
  std::filesystem::create_directories(dir + "/texts");
  Write(dir + "/model/config.json", "{}");
  Write(dir + "/model/model.safetensors", std::string(1001, 'w'));
  Write(dir + "/texts/b.txt", "bbb");
  Write(dir + "/texts/a.txt", "aa");
  Write(dir + "/extra.txt", "x");
  service::ValidatedJob job;
  job.options.init_from_hf_dir = dir + "/model";
  job.options.text_paths = {dir + "/texts", dir + "/extra.txt"};
  v1::JobSpec spec;
  spec.set_name("lineage-job");
  absl::StatusOr<provenance::Lineage> lineage = BuildJobLineage(spec, job, "cpu");
  ASSERT_TRUE(lineage.ok()) << lineage.status();
  ASSERT_EQ(lineage->inputs.size(), 5u);
  EXPECT_EQ(lineage->inputs[0].role, provenance::kRoleBaseModel);
  EXPECT_EQ(lineage->inputs[1].role, provenance::kRoleBaseModel);
  EXPECT_EQ(lineage->inputs[1].bytes, 1001u);
  EXPECT_EQ(lineage->inputs[2].path, dir + "/texts/a.txt");
  EXPECT_EQ(lineage->inputs[2].role, provenance::kRoleData);
  EXPECT_EQ(lineage->inputs[2].sha256_hex, provenance::Sha256Hex("aa"));
  EXPECT_EQ(lineage->inputs[4].path, dir + "/extra.txt");
  EXPECT_THAT(lineage->job_spec_json, HasSubstr("\"lineage-job\""));
  EXPECT_EQ(lineage->device_kind, "cpu");
  EXPECT_FALSE(lineage->build.version.empty());
}

// The lineage hashes what training reads (engine::ExpandCorpusFiles): one level of a text
// directory, without *.dat index files, symlinks or subdirectories (issue 21, point 5).
TEST(JobLineageTest, TextDirectoriesAreHashedAsTrainingListsThem) {
  const std::string dir = TempDir("lineage_corpus");
  std::filesystem::create_directories(dir + "/texts/sub");
  Write(dir + "/texts/a.txt", "aa");
  Write(dir + "/texts/a.dat", "index");
  Write(dir + "/texts/sub/deep.txt", "never read by training");
  std::filesystem::create_symlink(dir + "/texts/a.txt", dir + "/texts/link.txt");
  service::ValidatedJob job;
  job.options.text_paths = {dir + "/texts"};
  absl::StatusOr<provenance::Lineage> lineage = BuildJobLineage(v1::JobSpec(), job, "cpu");
  ASSERT_TRUE(lineage.ok()) << lineage.status();
  ASSERT_EQ(lineage->inputs.size(), 1u);
  EXPECT_EQ(lineage->inputs[0].path, dir + "/texts/a.txt");
  EXPECT_EQ(lineage->inputs[0].role, provenance::kRoleData);
}

TEST(JobLineageTest, MissingInputIsNamed) {
  service::ValidatedJob job;
  job.options.text_paths = {"/nonexistent/corpus.txt"};
  absl::StatusOr<provenance::Lineage> lineage = BuildJobLineage(v1::JobSpec(), job, "cpu");
  EXPECT_FALSE(lineage.ok());
  EXPECT_THAT(lineage.status().message(), HasSubstr("/nonexistent/corpus.txt"));
}

TEST(JobLineageTest, ComparisonFindsChangedNewAndGoneFiles) {
  const std::string dir = TempDir("lineage_compare");
  Write(dir + "/a.txt", "alpha");
  Write(dir + "/b.txt", "beta");
  service::ValidatedJob job;
  job.options.text_paths = {dir};
  const provenance::Lineage lineage = *BuildJobLineage(v1::JobSpec(), job, "cpu");
  EXPECT_TRUE(CompareDataInputs(lineage, *HashDataInputs(job)).empty());

  Write(dir + "/a.txt", "alphA");  // one byte
  std::filesystem::remove(dir + "/b.txt");
  Write(dir + "/c.txt", "gamma");
  const std::vector<provenance::DataChange> changes =
      CompareDataInputs(lineage, *HashDataInputs(job));
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].path, dir + "/a.txt");
  EXPECT_EQ(changes[0].old_sha256_hex, provenance::Sha256Hex("alpha"));
  EXPECT_EQ(changes[0].new_sha256_hex, provenance::Sha256Hex("alphA"));
  EXPECT_EQ(changes[1].path, dir + "/b.txt");
  EXPECT_TRUE(changes[1].new_sha256_hex.empty());
  EXPECT_EQ(changes[2].path, dir + "/c.txt");
  EXPECT_TRUE(changes[2].old_sha256_hex.empty());
  const std::string text = DescribeDataChanges(changes);
  EXPECT_THAT(text, HasSubstr(dir + "/a.txt changed since the job's lineage recorded it: sha256 " +
                              provenance::Sha256Hex("alpha") + " recorded, now " +
                              provenance::Sha256Hex("alphA")));
  EXPECT_THAT(text, HasSubstr("b.txt is gone"));
  EXPECT_THAT(text, HasSubstr("c.txt is new"));

  // Once allowed, the changes are what the lineage expects.
  provenance::Lineage allowed = lineage;
  allowed.data_changes = changes;
  EXPECT_TRUE(CompareDataInputs(allowed, *HashDataInputs(job)).empty());
}

TEST(JobLineageTest, TokenizerFileIsItsOwnRole) {
  const std::string dir = TempDir("lineage_tokenizer");
  Write(dir + "/t.txt", "text");
  Write(dir + "/sp.model", "model");
  service::ValidatedJob job;
  job.options.text_paths = {dir + "/t.txt"};
  job.options.tokenizer = dir + "/sp.model";
  absl::StatusOr<std::vector<provenance::InputFile>> inputs = HashDataInputs(job);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->size(), 2u);
  EXPECT_EQ((*inputs)[1].role, provenance::kRoleTokenizer);
  job.options.tokenizer = "bytes";
  EXPECT_EQ(HashDataInputs(job)->size(), 1u);
}

}  // namespace
}  // namespace megatrain::server
