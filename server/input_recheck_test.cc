// RecheckInput with openat2 and with its fallback (O_NOFOLLOW + the /proc/self/fd link): a
// symlink as the file or on its way, a FIFO (never blocking), a vanished file, a directory.
#include "server/input_recheck.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

class InputRecheckTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::filesystem::canonical(tmp ? tmp : "/tmp").string() + "/recheck" +
            (GetParam() ? "2" : "1");
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data/sub");
    std::filesystem::create_directories(root_ + "/outside");
    std::ofstream(root_ + "/data/file.txt") << "text";
    std::ofstream(root_ + "/data/sub/inner.txt") << "text";
    std::ofstream(root_ + "/outside/inner.txt") << "secret";
  }
  absl::Status Check(const std::string& path, bool directory_ok = false) {
    return RecheckInput("data.text_files[0]", path, directory_ok, GetParam());
  }
  std::string root_;
};

TEST_P(InputRecheckTest, UnchangedInputsPass) {
  EXPECT_TRUE(Check(root_ + "/data/file.txt").ok());
  EXPECT_TRUE(Check(root_ + "/data/sub", /*directory_ok=*/true).ok());
  EXPECT_EQ(Check(root_ + "/data/sub").code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(InputRecheckTest, ASymlinkAsTheFileOrOnItsWayIsRefused) {
  std::filesystem::remove(root_ + "/data/file.txt");
  std::filesystem::create_symlink(root_ + "/outside/inner.txt", root_ + "/data/file.txt");
  absl::Status s = Check(root_ + "/data/file.txt");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("data.text_files[0]"));
  std::filesystem::rename(root_ + "/data/sub", root_ + "/data/sub.orig");
  std::filesystem::create_directory_symlink(root_ + "/outside", root_ + "/data/sub");
  s = Check(root_ + "/data/sub/inner.txt");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
}

TEST_P(InputRecheckTest, AFifoIsRefusedWithoutBlockingAndAGoneFileIsNamed) {
  std::filesystem::remove(root_ + "/data/file.txt");
  ASSERT_EQ(mkfifo((root_ + "/data/file.txt").c_str(), 0600), 0);
  absl::Status s = Check(root_ + "/data/file.txt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("is now a FIFO"));
  s = Check(root_ + "/data/absent.txt");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

INSTANTIATE_TEST_SUITE_P(OpenAt2AndFallback, InputRecheckTest, ::testing::Bool());

}  // namespace
}  // namespace megatrain::server
