// The corpus listing: one level, sorted, *.dat, symlinks and subdirectories skipped, errors as
// statuses.
#include "engine/data/corpus_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const char* name) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

TEST(CorpusFilesTest, OneLevelSortedSkippingDatSymlinksAndSubdirectories) {
  const std::string dir = TempDir("corpus");
  std::ofstream(dir + "/b.txt") << "b";
  std::ofstream(dir + "/a") << "a";
  std::ofstream(dir + "/a.dat") << "index";
  fs::create_directories(dir + "/sub");
  std::ofstream(dir + "/sub/deep.txt") << "never read";
  fs::create_symlink(dir + "/b.txt", dir + "/link.txt");
  const std::string single = TempDir("single") + "/given.dat";
  std::ofstream(single) << "named on purpose";

  absl::StatusOr<std::vector<std::string>> files = ExpandCorpusFiles({dir, single});
  ASSERT_TRUE(files.ok()) << files.status();
  // A file named explicitly is taken as given, even *.dat.
  EXPECT_EQ(*files, (std::vector<std::string>{dir + "/a", dir + "/b.txt", single}));
}

TEST(CorpusFilesTest, MissingPathAndUnlistableDirectoryAreStatuses) {
  absl::StatusOr<std::vector<std::string>> missing = ExpandCorpusFiles({"/nonexistent/corpus"});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_NE(missing.status().message().find("/nonexistent/corpus"), std::string::npos);

  if (::geteuid() == 0) GTEST_SKIP() << "root lists any directory";
  const std::string dir = TempDir("locked");
  std::ofstream(dir + "/x.txt") << "x";
  ASSERT_EQ(::chmod(dir.c_str(), 0), 0);
  absl::StatusOr<std::vector<std::string>> locked = ExpandCorpusFiles({dir});
  ::chmod(dir.c_str(), 0755);
  EXPECT_FALSE(locked.ok());
  EXPECT_NE(locked.status().message().find(dir), std::string::npos);
}

}  // namespace
}  // namespace megatrain::engine
