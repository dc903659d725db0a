// ReadHfCompanionFiles: which files travel with a model, read by path or through held descriptors.
#include "engine/model/hf_companion_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string MakeDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/hf_companion_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> Names(const std::vector<HfCompanionFile>& files) {
  std::vector<std::string> names;
  for (const HfCompanionFile& f : files) names.push_back(f.name);
  return names;
}

TEST(HfCompanionFilesTest, KnowsTheTokenizerAndGenerationFilesOnly) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "chat_template.jinja", "tokenizer.model",
                           "merges.txt", "vocab.json"}) {
    EXPECT_TRUE(IsHfCompanionFileName(name)) << name;
  }
  for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json",
                           "optimizer.safetensors", "../tokenizer.json", "README.md", ""}) {
    EXPECT_FALSE(IsHfCompanionFileName(name)) << name;
  }
}

TEST(HfCompanionFilesTest, ReadsThePresentOnesByteForByteInAFixedOrder) {
  const std::string dir = MakeDir("present");
  Write(dir + "/generation_config.json", "{\"eos_token_id\": 2}\n");
  Write(dir + "/tokenizer.json", std::string("{\"model\": \"\xe4\xb8\xad\"}\0tail", 22));
  Write(dir + "/config.json", "{}");
  Write(dir + "/model.safetensors", "not copied");
  absl::StatusOr<std::vector<HfCompanionFile>> files = ReadHfCompanionFiles(dir, nullptr);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(Names(*files), ElementsAre("tokenizer.json", "generation_config.json"));
  EXPECT_EQ((*files)[0].bytes, std::string("{\"model\": \"\xe4\xb8\xad\"}\0tail", 22));
  EXPECT_EQ((*files)[1].bytes, "{\"eos_token_id\": 2}\n");
}

TEST(HfCompanionFilesTest, AFifoOrADirectoryUnderACompanionNameIsRefusedNamingIt) {
  const std::string dir = MakeDir("fifo");
  ASSERT_EQ(mkfifo((dir + "/tokenizer.json").c_str(), 0600), 0);
  absl::StatusOr<std::vector<HfCompanionFile>> files = ReadHfCompanionFiles(dir, nullptr);
  ASSERT_FALSE(files.ok());  // and it returned: the FIFO was not opened for a blocking read
  EXPECT_THAT(files.status().message(), HasSubstr("tokenizer.json"));

  const std::string dir2 = MakeDir("directory");
  std::filesystem::create_directories(dir2 + "/merges.txt");
  files = ReadHfCompanionFiles(dir2, nullptr);
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(), HasSubstr("merges.txt"));
}

TEST(HfCompanionFilesTest, WithHeldInputsOnlyTheCheckedDescriptorsAreRead) {
  const std::string dir = MakeDir("held");
  Write(dir + "/tokenizer.json", "checked content");
  Write(dir + "/tokenizer_config.json", "not checked by the daemon");
  InputFiles inputs;
  inputs.Add(dir + "/tokenizer.json", UniqueFd(open((dir + "/tokenizer.json").c_str(), O_RDONLY)));
  // Replaced after the check: the held descriptor still reads what was checked.
  std::filesystem::remove(dir + "/tokenizer.json");
  Write(dir + "/tokenizer.json", "swapped in later");
  absl::StatusOr<std::vector<HfCompanionFile>> files = ReadHfCompanionFiles(dir, &inputs);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(Names(*files), ElementsAre("tokenizer.json"));
  EXPECT_EQ((*files)[0].bytes, "checked content");
}

TEST(HfCompanionFilesTest, AFileOverTheCapIsRefused) {
  const std::string dir = MakeDir("big");
  {
    std::ofstream out(dir + "/vocab.json", std::ios::binary);
    out.seekp(static_cast<std::streamoff>(kMaxHfCompanionFileBytes));
    out.put('x');  // sparse: one byte past the cap
  }
  absl::StatusOr<std::vector<HfCompanionFile>> files = ReadHfCompanionFiles(dir, nullptr);
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kResourceExhausted) << files.status();
  EXPECT_THAT(files.status().message(), HasSubstr("vocab.json"));
}

}  // namespace
}  // namespace megatrain::engine
