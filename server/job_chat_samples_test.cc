// PrepareChatSamples with stand-in tools (shell scripts; the real tool's run is
// tests/server:chat_job_test): the content key follows every input that changes the samples,
// a whole earlier file is reused without starting a process, a cut one is not, and each way the
// tool can fail maps to its status with the tool's message.
#include "server/job_chat_samples.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

class JobChatSamplesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = Tmp(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/model");
    std::filesystem::create_directories(dir_ + "/tokens");
    std::filesystem::permissions(dir_ + "/tokens", std::filesystem::perms::owner_all);
    std::ofstream(dir_ + "/model/tokenizer.json") << "{\"model\": 1}";
    std::ofstream(dir_ + "/model/tokenizer_config.json") << "{\"chat_template\": \"x\"}";
    std::ofstream(dir_ + "/a.jsonl") << "{\"prompt\": \"p\", \"completion\": \"c\"}\n";
    std::ofstream(dir_ + "/b.jsonl") << "{\"prompt\": \"q\", \"completion\": \"d\"}\n";
    request_.model_dir = dir_ + "/model";
    request_.chat_paths = {dir_ + "/a.jsonl", dir_ + "/b.jsonl"};
    request_.format = "auto";
    request_.tokens_dir = dir_ + "/tokens";
    request_.model_vocab_size = 100;
  }

  // A stand-in tool: writes a 1-sample, 3-token MTSFT file to --out (unless told not to) and
  // prints `summary`, exits `code` with `err` on stderr; counts its runs in <dir>/runs.
  std::string Tool(const std::string& summary, int code = 0, const std::string& err = "") {
    const std::string path = dir_ + "/tool.sh";
    std::ofstream script(path);
    script << "#!/bin/sh\necho run >> " << dir_ << "/runs\n"
           << "for a in \"$@\"; do case \"$a\" in --out=*) out=\"${a#--out=}\";; esac; done\n";
    if (code == 0) {
      // 32-byte header + 2 u64 offsets + 3 u32 ids + 3 mask bytes = 63 bytes.
      script << "head -c 63 /dev/zero > \"$out\"\n";
    }
    script << "echo '" << summary << "'\n";
    if (!err.empty()) script << "echo '" << err << "' >&2\n";
    script << "exit " << code << "\n";
    script.close();
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path;
  }

  int Runs() {
    std::ifstream in(dir_ + "/runs");
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }

  std::string dir_;
  ChatSamplesRequest request_;
};

constexpr char kSummary[] =
    R"({"samples": 1, "tokens": 3, "counted_tokens": 1, "vocab_size": 7, "output_version": 1})";

TEST_F(JobChatSamplesTest, KeyFollowsFormatTokenizerFilesAndDataInOrder) {
  absl::StatusOr<std::string> key = ChatSamplesKey(request_);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->size(), 64u);
  EXPECT_EQ(*ChatSamplesKey(request_), *key);

  ChatSamplesRequest other = request_;
  other.format = "prompt_completion";
  EXPECT_NE(*ChatSamplesKey(other), *key);
  other = request_;
  std::swap(other.chat_paths[0], other.chat_paths[1]);
  EXPECT_NE(*ChatSamplesKey(other), *key);

  std::ofstream(dir_ + "/model/chat_template.jinja") << "{{ messages }}";
  const std::string with_jinja = *ChatSamplesKey(request_);
  EXPECT_NE(with_jinja, *key);
  std::ofstream(dir_ + "/model/tokenizer.json") << "{\"model\": 2}";
  EXPECT_NE(*ChatSamplesKey(request_), with_jinja);
  // A file the tool does not read changes nothing.
  const std::string before = *ChatSamplesKey(request_);
  std::ofstream(dir_ + "/model/README.md") << "hello";
  EXPECT_EQ(*ChatSamplesKey(request_), before);
}

TEST_F(JobChatSamplesTest, WrittenOnceThenReusedAndRunAgainWhenCut) {
  request_.tool = Tool(kSummary);
  absl::StatusOr<ChatSamples> first = PrepareChatSamples(request_, [] { return false; });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->reused);
  EXPECT_EQ(first->samples, 1u);
  EXPECT_EQ(first->tokens, 3u);
  EXPECT_EQ(first->counted_tokens, 1u);
  EXPECT_EQ(first->path, absl::StrCat(request_.tokens_dir, "/", first->key, ".mtsft"));
  EXPECT_TRUE(std::filesystem::exists(request_.tokens_dir + "/" + first->key + ".json"));
  EXPECT_EQ(Runs(), 1);

  absl::StatusOr<ChatSamples> again = PrepareChatSamples(request_, [] { return false; });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->reused);
  EXPECT_EQ(again->path, first->path);
  EXPECT_EQ(Runs(), 1);

  std::filesystem::resize_file(first->path, 40);
  absl::StatusOr<ChatSamples> cut = PrepareChatSamples(request_, [] { return false; });
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_FALSE(cut->reused);
  EXPECT_EQ(Runs(), 2);
  EXPECT_EQ(std::filesystem::file_size(first->path), 63u);

  absl::StatusOr<std::string> link = LinkChatSamples(*cut, "job-000007");
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(*link, request_.tokens_dir + "/job-000007.mtsft");
  EXPECT_EQ(std::filesystem::read_symlink(*link).string(), cut->key + ".mtsft");
}

TEST_F(JobChatSamplesTest, EachFailureMapsToItsStatus) {
  auto run = [&](const std::string& tool) {
    request_.tool = tool;
    return PrepareChatSamples(request_, [] { return false; }).status();
  };
  absl::Status s = run(Tool("", 1, "a.jsonl:3: field messages: no assistant message"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.chat_files"));
  EXPECT_THAT(s.message(), HasSubstr("a.jsonl:3: field messages"));

  s = run(Tool("", 2, "megatrain_chat_tokenize: No module named tokenizers: run scripts/setup"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("run scripts/setup"));

  s = run(dir_ + "/no/such/tool");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("chat_tokenize_binary"));

  s = run(Tool("", 3, "boom"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("exited with 3"));

  s = run(Tool(R"({"samples": 1, "tokens": 3, "counted_tokens": 1, "vocab_size": 7,
                   "output_version": 99})"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("output version 99"));

  s = run(Tool("not json"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);

  request_.model_vocab_size = 5;
  s = run(Tool(kSummary));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("outside the model's vocab_size 5"));
}

}  // namespace
}  // namespace megatrain::server
