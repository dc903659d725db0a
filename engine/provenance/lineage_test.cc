// Lineage: exact JSON round trip, strict parsing, input hashing.
#include "engine/provenance/lineage.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/common/input_files.h"
#include "engine/common/safe_files.h"
#include "engine/provenance/sha256.h"

namespace megatrain::provenance {
namespace {

Lineage Sample() {
  Lineage l;
  l.job_spec_json = R"({"steps": 7, "seed": 3})";
  l.inputs = {{kRoleBaseModel, "/m/model.safetensors", std::string(64, 'a'), 123},
              {kRoleData, "/d/x.txt", std::string(64, 'b'), 0},
              {kRoleTokenizer, "/t/sp.model", std::string(64, 'c'), 77}};
  l.build = CurrentBuild();
  l.device_kind = "cpu";
  l.data_changes = {{"/d/x.txt", std::string(64, 'b'), std::string(64, 'd'), "2025-01-02T03:04:05Z",
                     "fixed a typo"}};
  return l;
}

TEST(LineageTest, JsonRoundTripIsExact) {
  const Lineage l = Sample();
  const std::string text = LineageToJson(l);
  absl::StatusOr<Lineage> parsed = ParseLineage(text, "lineage.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, l);
  EXPECT_EQ(LineageToJson(*parsed), text);
  EXPECT_FALSE(l.build.version.empty());
  EXPECT_FALSE(l.build.compiler.empty());
}

TEST(LineageTest, StrictParsingNamesTheField) {
  nlohmann::json j = nlohmann::json::parse(LineageToJson(Sample()));
  j["extra"] = 1;
  absl::StatusOr<Lineage> extra = ParseLineage(j.dump(), "src");
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("extra"), std::string::npos);

  j = nlohmann::json::parse(LineageToJson(Sample()));
  j["inputs"][1]["role"] = "weights";
  absl::StatusOr<Lineage> role = ParseLineage(j.dump(), "src");
  ASSERT_FALSE(role.ok());
  EXPECT_NE(role.status().message().find("src.inputs[1].role"), std::string::npos) << role.status();

  j = nlohmann::json::parse(LineageToJson(Sample()));
  j["data_changes"][0]["new_sha256"] = "XYZ";
  EXPECT_FALSE(ParseLineage(j.dump(), "src").ok());
  EXPECT_FALSE(ParseLineage("{", "src").ok());
}

TEST(LineageTest, HashInputsExpandsDirectoriesInSortedOrder) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/inputs";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/b.txt") << "bee";
  std::ofstream(dir + "/a.txt") << "a";
  std::ofstream(dir + "/sub/c.txt") << "seven b";
  absl::StatusOr<std::vector<InputFile>> hashed = HashInputs(kRoleData, {dir, dir + "/a.txt"});
  ASSERT_TRUE(hashed.ok()) << hashed.status();
  ASSERT_EQ(hashed->size(), 4u);
  EXPECT_EQ((*hashed)[0].path, dir + "/a.txt");
  EXPECT_EQ((*hashed)[1].path, dir + "/b.txt");
  EXPECT_EQ((*hashed)[2].path, dir + "/sub/c.txt");
  EXPECT_EQ((*hashed)[2].bytes, 7u);
  EXPECT_EQ((*hashed)[1].sha256_hex, Sha256Hex("bee"));
  EXPECT_EQ((*hashed)[3].role, kRoleData);
  absl::StatusOr<std::vector<InputFile>> missing = HashInputs(kRoleData, {dir + "/nope"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
}

// A daemon's run (a held set): a model directory contributes only the files the run reads, each
// through its descriptor; a README and a symlink out of the directory are neither opened nor
// recorded (the lineage would otherwise carry the hash of a file the submitter cannot read).
TEST(LineageTest, WithAHeldSetADirectoryContributesOnlyItsHeldFiles) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/held";
  const std::string dir = root + "/model";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << "{}";
  std::ofstream(dir + "/README.md") << "readme";
  std::ofstream(root + "/secret") << "not the submitter's";
  std::filesystem::create_symlink(root + "/secret", dir + "/linked.safetensors");
  engine::InputFiles held;
  absl::StatusOr<engine::UniqueFd> config = engine::OpenRegularFileForRead(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  held.Add(dir + "/config.json", *std::move(config));
  absl::StatusOr<std::vector<InputFile>> hashed = HashInputs(kRoleBaseModel, {dir}, &held);
  ASSERT_TRUE(hashed.ok()) << hashed.status();
  ASSERT_EQ(hashed->size(), 1u);
  EXPECT_EQ((*hashed)[0].path, dir + "/config.json");
  EXPECT_EQ((*hashed)[0].sha256_hex, Sha256Hex("{}"));
  // Without a set (the CLI's own files), every regular file is hashed, as before.
  absl::StatusOr<std::vector<InputFile>> all = HashInputs(kRoleBaseModel, {dir});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 3u);
}

}  // namespace
}  // namespace megatrain::provenance
