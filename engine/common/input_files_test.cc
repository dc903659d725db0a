// InputFiles: reads come from the held descriptor, whatever the path names by then.
#include "engine/common/input_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name;
}

TEST(InputFilesTest, ReadsTheHeldFileAfterThePathIsSwapped) {
  const std::string path = TempPath("checked.txt");
  const std::string other = TempPath("other.txt");
  std::ofstream(path) << "checked content";
  std::ofstream(other) << "swapped in";
  InputFiles inputs;
  inputs.Add(path, UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)));
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  EXPECT_EQ(*ReadInputFile(&inputs, path), "checked content");
  EXPECT_EQ(*ReadInputFile(nullptr, path), "swapped in");  // by path: what is there now
  EXPECT_EQ(*inputs.Size(path), 15u);
  absl::StatusOr<UniqueFd> dup = inputs.Duplicate(path);
  ASSERT_TRUE(dup.ok());
  char c = 0;
  EXPECT_EQ(::pread(dup->get(), &c, 1, 0), 1);
  EXPECT_EQ(c, 'c');
}

TEST(InputFilesTest, RefusesPathsThatWereNotCheckedAndCapsTheSize) {
  const std::string path = TempPath("capped.txt");
  std::ofstream(path) << "0123456789";
  InputFiles inputs;
  inputs.Add(path, UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)));
  EXPECT_EQ(inputs.Read(path, 4).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(inputs.Read(path, 10).value(), "0123456789");
  const absl::Status s = inputs.Read(TempPath("never_checked.txt")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("never_checked.txt"), std::string::npos);
}

}  // namespace
}  // namespace megatrain::engine
