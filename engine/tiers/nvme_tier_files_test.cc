// ReplaceableTierFileBytes: only the tier's own regular, singly-linked files count.
#include "engine/tiers/nvme_tier_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

std::string FreshDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(root != nullptr ? root : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Creates `path` with `bytes` allocated; returns the bytes the disk allocated to it.
uint64_t AllocatedFile(const std::string& path, off_t bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::posix_fallocate(fd, 0, bytes), 0) << path;
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  ::close(fd);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST(ReplaceableTierFileBytesTest, EmptyOrMissingDirectoryHoldsNothing) {
  const std::string dir = FreshDir("tier_files_empty");
  EXPECT_EQ(ReplaceableTierFileBytes(dir), 0u);
  EXPECT_EQ(ReplaceableTierFileBytes(dir + "/absent"), 0u);
}

TEST(ReplaceableTierFileBytesTest, CountsTheAllocatedBytesOfTheTiersFiles) {
  const std::string dir = FreshDir("tier_files_own");
  const uint64_t state = AllocatedFile(dir + "/" + kOptimizerStateFileName, 3 << 20);
  const uint64_t grads = AllocatedFile(dir + "/" + kGradientFileName, 1 << 20);
  const uint64_t copy = AllocatedFile(dir + "/" + kComputeCopyFileName, (1 << 20) + 4096);
  EXPECT_GE(state, uint64_t{3} << 20);
  EXPECT_EQ(ReplaceableTierFileBytes(dir), state + grads + copy);
}

TEST(ReplaceableTierFileBytesTest, IgnoresOtherNamesLinksAndDirectories) {
  const std::string dir = FreshDir("tier_files_other");
  const std::string elsewhere = FreshDir("tier_files_elsewhere");
  AllocatedFile(dir + "/notes.bin", 1 << 20);  // not a tier file
  // A symlink under a tier name: replacing it frees nothing (and the target is not ours).
  AllocatedFile(elsewhere + "/big", 2 << 20);
  ASSERT_EQ(::symlink((elsewhere + "/big").c_str(), (dir + "/" + kGradientFileName).c_str()), 0);
  // A file with a second link: unlinking the tier's name frees no blocks.
  AllocatedFile(elsewhere + "/linked", 1 << 20);
  ASSERT_EQ(::link((elsewhere + "/linked").c_str(),
                   (dir + "/" + kOptimizerStateFileName).c_str()),
            0);
  // A directory under a tier name.
  std::filesystem::create_directories(dir + "/" + kComputeCopyFileName);
  EXPECT_EQ(ReplaceableTierFileBytes(dir), 0u);
}

// A run removes the previous run's tier files before it reserves its own: a symlink under a tier
// name goes (its target stays), other names and a directory under a tier name stay.
TEST(RemoveTierFilesTest, RemovesTheTiersNamesOnly) {
  const std::string dir = FreshDir("tier_files_remove");
  const std::string elsewhere = FreshDir("tier_files_remove_target");
  AllocatedFile(dir + "/" + kOptimizerStateFileName, 1 << 20);
  AllocatedFile(dir + "/notes.bin", 4096);
  AllocatedFile(elsewhere + "/target", 4096);
  ASSERT_EQ(::symlink((elsewhere + "/target").c_str(), (dir + "/" + kGradientFileName).c_str()),
            0);
  std::filesystem::create_directories(dir + "/" + kComputeCopyFileName);
  ASSERT_TRUE(RemoveTierFiles(dir).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + kOptimizerStateFileName));
  EXPECT_FALSE(std::filesystem::is_symlink(dir + "/" + kGradientFileName));
  EXPECT_TRUE(std::filesystem::exists(elsewhere + "/target"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/notes.bin"));
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/" + kComputeCopyFileName));
  EXPECT_EQ(ReplaceableTierFileBytes(dir), 0u);
  EXPECT_TRUE(RemoveTierFiles(dir + "/absent").ok());
}

TEST(RankTierDirectoryTest, NamesTheRanksSubdirectory) {
  EXPECT_EQ(RankTierDirectory("/var/tmp/nvme", 3), "/var/tmp/nvme/rank-3");
}

}  // namespace
}  // namespace megatrain::engine::tiers
