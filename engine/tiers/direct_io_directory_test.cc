// Tests of CheckDirectIoDirectory: block-backed scratch accepted, tmpfs refused, bad paths named.
#include "engine/tiers/direct_io_directory.h"

#include <sys/vfs.h>

#include <filesystem>

#include "engine/tiers/direct_file.h"
#include "engine/tiers/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

using ::testing::HasSubstr;

TEST(CheckDirectIoDirectory, AcceptsBlockBackedScratchAndLeavesNoProbe) {
  absl::Status usable;
  const std::string dir = FreshTestDir("accept", &usable);
  ASSERT_TRUE(usable.ok()) << usable << " (TEST_TMPDIR should be on the block device here)";
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(CheckDirectIoDirectory, RefusesTmpfs) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994) {
    GTEST_SKIP() << "/dev/shm is not a tmpfs on this machine";
  }
  const absl::Status s = CheckDirectIoDirectory("/dev/shm");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("nvme_dir=/dev/shm is on tmpfs"));
}

TEST(CheckDirectIoDirectory, NamesMissingDirectoryAndPlainFile) {
  EXPECT_THAT(CheckDirectIoDirectory("/nonexistent/megatrain").message(),
              HasSubstr("nvme_dir=/nonexistent/megatrain"));
  absl::Status usable;
  const std::string dir = FreshTestDir("plain_file", &usable);
  ASSERT_TRUE(DirectFile::Open(dir + "/f", DirectFile::Mode::kCreateTruncate).ok());
  EXPECT_THAT(CheckDirectIoDirectory(dir + "/f").message(), HasSubstr("is not a directory"));
}

}  // namespace
}  // namespace megatrain::engine::tiers
