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
#include "service/hf_directory_files.h"

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
    return RecheckInput("data.text_files[0]", path, directory_ok, GetParam()).status();
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

// RecheckJobInputs holds what it checked: a text directory's files and the files of
// model.hf_directory read as they were at the check, whatever is renamed over them later.
class JobInputsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::filesystem::canonical(tmp ? tmp : "/tmp").string() + "/job_inputs";
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data/corpus");
    std::filesystem::create_directories(root_ + "/data/hf");
    std::filesystem::create_directories(root_ + "/outside");
    std::ofstream(root_ + "/data/corpus/a.txt") << "checked a";
    std::ofstream(root_ + "/data/hf/config.json") << "{}";
    std::ofstream(root_ + "/data/hf/model.safetensors") << "checked weights";
    // A tokenizer file that is not JSON travels into checkpoints too (hf_companion_files.h);
    // a README does not.
    std::ofstream(root_ + "/data/hf/merges.txt") << "checked merges";
    std::ofstream(root_ + "/data/hf/README.md") << "not read";
    std::ofstream(root_ + "/outside/secret.json") << "{\"secret\": 1}";
    job_.data_roots = {root_ + "/data"};
    job_.options.text_paths = {root_ + "/data/corpus"};
    job_.options.init_from_hf_dir = root_ + "/data/hf";
  }
  void Replace(const std::string& path, const std::string& text) {
    std::ofstream(path + ".new") << text;
    std::filesystem::rename(path + ".new", path);
  }
  std::string root_;
  ValidatedJob job_;
};

TEST_F(JobInputsTest, HeldFilesAreReadAsCheckedAndLaterFilesAreNotHeld) {
  absl::StatusOr<engine::InputFiles> inputs = RecheckJobInputs(job_);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  EXPECT_THAT(inputs->Paths(),
              ::testing::ElementsAre(root_ + "/data/corpus/a.txt", root_ + "/data/hf/config.json",
                                     root_ + "/data/hf/merges.txt",
                                     root_ + "/data/hf/model.safetensors"));
  Replace(root_ + "/data/corpus/a.txt", "swapped a");
  Replace(root_ + "/data/hf/model.safetensors", "swapped weights");
  std::ofstream(root_ + "/data/corpus/b.txt") << "added later";
  EXPECT_EQ(*inputs->Read(root_ + "/data/corpus/a.txt"), "checked a");
  EXPECT_EQ(*inputs->Read(root_ + "/data/hf/model.safetensors"), "checked weights");
  Replace(root_ + "/data/hf/merges.txt", "swapped merges");
  EXPECT_EQ(*inputs->Read(root_ + "/data/hf/merges.txt"), "checked merges");
  EXPECT_EQ(inputs->Read(root_ + "/data/corpus/b.txt").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobInputsTest, TooManyTextFilesAreRefused) {
  job_.options.init_from_hf_dir.clear();
  for (size_t i = 0; i <= kMaxHeldTextFiles; ++i) {
    std::ofstream(root_ + "/data/corpus/f" + std::to_string(i) + ".txt") << "x";
  }
  const absl::Status s = RecheckJobInputs(job_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("data.text_files[0]: more than 4096 text files"));
}

TEST_F(JobInputsTest, AnHfFileLeadingOutsideTheRootsOrOverItsCapIsRefused) {
  std::filesystem::create_symlink(root_ + "/outside/secret.json",
                                  root_ + "/data/hf/tokenizer_config.json");
  absl::Status s = RecheckJobInputs(job_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("model.hf_directory: tokenizer_config.json"));
  std::filesystem::remove(root_ + "/data/hf/tokenizer_config.json");
  std::ofstream(root_ + "/data/hf/config.json") << std::string(service::kMaxHfConfigBytes + 1, ' ');
  s = RecheckJobInputs(job_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

}  // namespace
}  // namespace megatrain::server
