// The errno mapping's codes, WriteAll/ReadAll round trip and ReadAll's bound.
#include "engine/common/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "engine/common/unique_fd.h"

namespace megatrain::engine {
namespace {

TEST(FileIoTest, ErrnoStatusMapsCodesAndKeepsContext) {
  EXPECT_TRUE(absl::IsNotFound(ErrnoStatus(ENOENT, "x")));
  EXPECT_TRUE(absl::IsAlreadyExists(ErrnoStatus(EEXIST, "x")));
  EXPECT_TRUE(absl::IsPermissionDenied(ErrnoStatus(EACCES, "x")));
  EXPECT_TRUE(absl::IsResourceExhausted(ErrnoStatus(ENOSPC, "x")));
  EXPECT_TRUE(absl::IsDataLoss(ErrnoStatus(EIO, "x")));
  EXPECT_TRUE(absl::IsInternal(ErrnoStatus(EBADF, "x")));
  EXPECT_NE(ErrnoStatus(ENOENT, "/some/path: cannot open").message().find("/some/path"),
            std::string::npos);
}

TEST(FileIoTest, WriteAllThenReadAllRoundTripsAndReadAllIsBounded) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/file_io";
  const std::string text(200000, 'q');
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(WriteAll(fd.get(), text, path).ok());
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  absl::StatusOr<std::string> back = ReadAll(fd.get(), path, text.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);
  ASSERT_EQ(::lseek(fd.get(), 0, SEEK_SET), 0);
  EXPECT_TRUE(absl::IsResourceExhausted(ReadAll(fd.get(), path, text.size() - 1).status()));
  EXPECT_FALSE(WriteAll(-1, std::string_view("x"), path).ok());
}

}  // namespace
}  // namespace megatrain::engine
