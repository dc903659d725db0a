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

TEST(RankTierDirectoryTest, NamesTheRanksSubdirectory) {
  EXPECT_EQ(RankTierDirectory("/var/tmp/nvme", 3), "/var/tmp/nvme/rank-3");
}

}  // namespace
}  // namespace megatrain::engine::tiers
