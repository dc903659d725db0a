// Tests of safe_files: FIFOs/sockets refused without blocking, writes never follow symlinks.
#include "engine/common/safe_files.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& tag) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/safe_files_" + tag;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(OpenRegularFileForRead, RefusesAFifoWithoutBlocking) {
  const std::string dir = FreshDir("fifo");
  ASSERT_EQ(::mkfifo((dir + "/pipe").c_str(), 0600), 0);
  // Without O_NONBLOCK this open would wait for a writer forever.
  absl::StatusOr<UniqueFd> fd = OpenRegularFileForRead(dir + "/pipe");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fd.status().message(), HasSubstr("is a FIFO, not a regular file"));
  EXPECT_EQ(ReadRegularFile(dir + "/pipe").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpenRegularFileForRead, RefusesDevicesAndDirectoriesAndReadsFiles) {
  EXPECT_THAT(OpenRegularFileForRead("/dev/null").status().message(),
              HasSubstr("is a character device"));
  const std::string dir = FreshDir("types");
  EXPECT_THAT(OpenRegularFileForRead(dir).status().message(), HasSubstr("is a directory"));
  EXPECT_EQ(OpenRegularFileForRead(dir + "/missing").status().code(),
            absl::StatusCode::kNotFound);
  std::ofstream(dir + "/f") << "hello";
  absl::StatusOr<std::string> text = ReadRegularFile(dir + "/f");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "hello");
  EXPECT_EQ(ReadRegularFile(dir + "/f", 3).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(OpenRegularFileForRead, RefusesASocket) {
  const std::string dir = FreshDir("sock");
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = "/tmp/mt-safe-files-test." + std::to_string(::getpid());
  ::unlink(path.c_str());
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_FALSE(OpenRegularFileForRead(path).ok());
  ::close(s);
  ::unlink(path.c_str());
}

TEST(WriteFileInDirectory, ReplacesAPlantedSymlinkInsteadOfWritingThroughIt) {
  const std::string dir = FreshDir("symlink");
  std::ofstream(dir + "/victim") << "precious";
  std::filesystem::create_symlink(dir + "/victim", dir + "/result.json");
  ASSERT_TRUE(WriteFileInDirectory(dir, "result.json", "{}\n").ok());
  EXPECT_EQ(Slurp(dir + "/victim"), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(dir + "/result.json"));
  EXPECT_EQ(Slurp(dir + "/result.json"), "{}\n");
  struct stat st;
  ASSERT_EQ(::stat((dir + "/result.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077 & ~0050, 0u) << std::oct << st.st_mode;  // no world, no group write
  // Only the file itself is left: no temporary beside it.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 2);
  EXPECT_EQ(WriteFileInDirectory(dir, "../x", "").code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileInDirectoryWriter, WritesPiecesLargerThanItsBufferAndRenamesAtCommit) {
  const std::string dir = FreshDir("writer");
  std::ofstream(dir + "/victim") << "precious";
  std::filesystem::create_symlink(dir + "/victim", dir + "/tokens.u16");
  absl::StatusOr<FileInDirectoryWriter> w = FileInDirectoryWriter::Create(dir, "tokens.u16");
  ASSERT_TRUE(w.ok()) << w.status();
  std::string expected;
  for (int piece = 0; piece < 40; ++piece) {
    // Small pieces, one as large as several buffers, and empty ones.
    const std::string bytes(piece == 17 ? (9 << 20) : piece % 5 == 0 ? 0 : 1000 + piece,
                            static_cast<char>('a' + piece % 26));
    ASSERT_TRUE(w->Append(bytes).ok());
    expected += bytes;
  }
  EXPECT_EQ(w->bytes_written(), expected.size());
  // Nothing under the final name before Commit: the planted symlink is still there.
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/tokens.u16"));
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(Slurp(dir + "/victim"), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(dir + "/tokens.u16"));
  EXPECT_EQ(Slurp(dir + "/tokens.u16"), expected);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 2);
}

TEST(FileInDirectoryWriter, DestroyedBeforeCommitLeavesNothing) {
  const std::string dir = FreshDir("writer_abandoned");
  std::ofstream(dir + "/tokens.u16") << "old";
  {
    absl::StatusOr<FileInDirectoryWriter> w = FileInDirectoryWriter::Create(dir, "tokens.u16");
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Append(std::string(5 << 20, 'n')).ok());
    FileInDirectoryWriter moved = *std::move(w);  // the temporary follows the move
    ASSERT_TRUE(moved.Append("more").ok());
  }
  EXPECT_EQ(Slurp(dir + "/tokens.u16"), "old");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(FileInDirectoryWriter::Create(dir, "a/b").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MakeDirectories, CreatesWithMode0750AndRefusesAFileInTheWay) {
  const std::string dir = FreshDir("mkdir");
  const mode_t old = ::umask(0);
  ASSERT_TRUE(MakeDirectories(dir + "/a/b/c").ok());
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat((dir + "/a/b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_TRUE(MakeDirectories(dir + "/a/b/c").ok());  // existing: fine
  std::ofstream(dir + "/file") << "x";
  EXPECT_EQ(MakeDirectories(dir + "/file/sub").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace megatrain::engine
