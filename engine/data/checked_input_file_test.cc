// OpenCheckedInputFile: the size and content of what was opened (the job's held descriptor when
// there is one), and refusals of FIFOs and missing files that name the path.
#include "engine/data/checked_input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(CheckedInputFileTest, OpensARegularFileWithItsSize) {
  const std::string path = TempPath("plain.bin");
  std::ofstream(path) << "0123456789";
  absl::StatusOr<CheckedInputFile> f = OpenCheckedInputFile(path, nullptr);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size, 10u);
  char c = 0;
  EXPECT_EQ(::pread(f->fd.get(), &c, 1, 3), 1);
  EXPECT_EQ(c, '3');
}

TEST(CheckedInputFileTest, ReadsTheJobsHeldFileNotWhatThePathNamesNow) {
  const std::string path = TempPath("held.bin");
  const std::string other = TempPath("swapped.bin");
  std::ofstream(path) << "held";
  std::ofstream(other) << "swapped in later";
  InputFiles inputs;
  inputs.Add(path, UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)));
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  absl::StatusOr<CheckedInputFile> f = OpenCheckedInputFile(path, &inputs);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size, 4u);
  char c = 0;
  EXPECT_EQ(::pread(f->fd.get(), &c, 1, 0), 1);
  EXPECT_EQ(c, 'h');
  // A path the job did not check is not opened by name.
  const absl::Status unchecked = OpenCheckedInputFile(TempPath("plain.bin"), &inputs).status();
  EXPECT_EQ(unchecked.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unchecked.message().find("plain.bin: cannot open: "), std::string::npos) << unchecked;
}

TEST(CheckedInputFileTest, RefusesAFifoAndAMissingFileNamingThePath) {
  const std::string fifo = TempPath("pipe.bin");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status not_regular = OpenCheckedInputFile(fifo, nullptr).status();
  EXPECT_EQ(not_regular.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_regular.message().find("pipe.bin"), std::string::npos) << not_regular;
  EXPECT_NE(not_regular.message().find("a FIFO, not a regular file"), std::string::npos)
      << not_regular;
  const absl::Status missing = OpenCheckedInputFile(TempPath("missing.bin"), nullptr).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("missing.bin: cannot open: "), std::string::npos) << missing;
}

}  // namespace
}  // namespace megatrain::engine
