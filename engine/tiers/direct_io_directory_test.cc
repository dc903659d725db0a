// Tests of CheckDirectIoDirectory: block-backed scratch accepted, tmpfs refused, bad paths named.
#include "engine/tiers/direct_io_directory.h"

#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/tiers/direct_file.h"
#include "engine/tiers/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

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

// Issue 16, point 1: a group member who can write to nvme_dir plants a symlink where the probe
// used to be created (".megatrain_odirect_probe.<pid>"): the check must not write through it.
TEST(CheckDirectIoDirectory, NeverWritesThroughAPlantedProbeSymlink) {
  absl::Status usable;
  const std::string dir = FreshTestDir("probe_symlink", &usable);
  ASSERT_TRUE(usable.ok()) << usable;
  const std::string victim = dir + "/../probe_symlink_victim";
  std::ofstream(victim) << "precious";
  const std::string planted = absl::StrCat(dir, "/.megatrain_odirect_probe.", ::getpid());
  std::filesystem::create_symlink(victim, planted);
  EXPECT_TRUE(CheckDirectIoDirectory(dir).ok());
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(planted));
}

TEST(DirectFile, TruncatingCreateReplacesAPlantedSymlinkAndNeverFollowsOne) {
  absl::Status usable;
  const std::string dir = FreshTestDir("direct_file_symlink", &usable);
  ASSERT_TRUE(usable.ok()) << usable;
  const std::string victim = dir + "/../direct_file_victim";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, dir + "/optimizer_state.bin");
  // Opening an existing file refuses the symlink.
  absl::StatusOr<DirectFile> existing =
      DirectFile::Open(dir + "/optimizer_state.bin", DirectFile::Mode::kOpenExisting);
  EXPECT_EQ(existing.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(existing.status().message(), HasSubstr("symlink"));
  EXPECT_FALSE(
      DirectFile::Open(dir + "/optimizer_state.bin", DirectFile::Mode::kCreateOrOpen).ok());
  // A truncating create makes a new file in the symlink's place.
  absl::StatusOr<DirectFile> fresh =
      DirectFile::Open(dir + "/optimizer_state.bin", DirectFile::Mode::kCreateTruncate);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->Reserve(4096).ok());
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(dir + "/optimizer_state.bin"));
}

TEST(DirectFile, RefusesAFifoWithoutBlocking) {
  absl::Status usable;
  const std::string dir = FreshTestDir("direct_file_fifo", &usable);
  ASSERT_EQ(::mkfifo((dir + "/state.bin").c_str(), 0600), 0);
  EXPECT_FALSE(DirectFile::Open(dir + "/state.bin", DirectFile::Mode::kOpenExisting).ok());
}

}  // namespace
}  // namespace megatrain::engine::tiers
