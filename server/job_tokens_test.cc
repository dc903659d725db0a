// PrepareJobTokens with the real megatrain_tokenize: the token file holds what training on the
// text would use, is named by the inputs' hashes, is reused without starting a process (and
// not when cut), and the tool's failure and a vocabulary larger than the model's are reported.
#include "server/job_tokens.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/data/text_corpus.h"
#include "engine/data/text_tokenizer.h"
#include "absl/strings/str_cat.h"
#include "engine/data/token_file.h"
#include "engine/data/tokenize_version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::string Tool() {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") +
         "/engine/data/megatrain_tokenize";
}

class JobTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = Tmp("corpus.txt");
    std::ofstream f(corpus_);
    for (int i = 0; i < 37; ++i) f << "Fortune " << i << ": a penny saved is a penny earned.\n%\n";
    request_.tokenize_binary = Tool();
    request_.tokenizer = "bytes";
    request_.text_paths = {corpus_};
    request_.tokens_dir = Tmp(
        std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/tokens");
    request_.output_version = engine::kTokenizeOutputVersion;
    request_.key = TokenFileKey(request_.output_version,
                                {{provenance::kRoleData, corpus_, std::string(64, 'a'), 1}});
    request_.model_vocab_size = 256;
  }
  std::string corpus_;
  JobTokensRequest request_;
};

TEST_F(JobTokensTest, WritesTheTrainingTokensThenReusesThem) {
  absl::StatusOr<JobTokens> made = PrepareJobTokens(request_, [] { return false; });
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_FALSE(made->reused);
  EXPECT_EQ(made->path, request_.tokens_dir + "/" + request_.key + ".u16");
  EXPECT_EQ(made->format, "u16");
  EXPECT_EQ(made->vocab_size, 256);
  EXPECT_TRUE(std::filesystem::exists(request_.tokens_dir + "/" + request_.key + ".json"));
  EXPECT_FALSE(std::filesystem::exists(request_.tokens_dir + "/" + request_.key + ".part"));

  auto tokenizer = engine::CreateTextTokenizer("bytes");
  ASSERT_TRUE(tokenizer.ok());
  auto docs = engine::LoadTextDocuments({corpus_});
  ASSERT_TRUE(docs.ok()) << docs.status();
  auto expected = engine::TokenizeDocuments(*docs, **tokenizer);
  ASSERT_TRUE(expected.ok());
  auto file = engine::TokenFile::Open(made->path, engine::TokenFileFormat::kUint16);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->size(), expected->size());
  EXPECT_EQ(made->tokens, expected->size());
  std::vector<int32_t> read(file->size());
  ASSERT_TRUE(file->Read(0, read.size(), read.data()).ok());
  EXPECT_EQ(read, *expected);

  // Reused: no process is started (the binary does not even exist), the file is untouched.
  struct stat before {};
  ASSERT_EQ(stat(made->path.c_str(), &before), 0);
  JobTokensRequest again = request_;
  again.tokenize_binary = "/no/such/megatrain_tokenize";
  absl::StatusOr<JobTokens> reused = PrepareJobTokens(again, [] { return false; });
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_TRUE(reused->reused);
  EXPECT_EQ(reused->path, made->path);
  EXPECT_EQ(reused->tokens, made->tokens);
  struct stat after {};
  ASSERT_EQ(stat(made->path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);

  // A cut file is not reused: the tool must run again (and here it cannot).
  std::filesystem::resize_file(made->path, 11);
  absl::StatusOr<JobTokens> cut = PrepareJobTokens(again, [] { return false; });
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kFailedPrecondition) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr("/no/such/megatrain_tokenize"));
}

TEST_F(JobTokensTest, ToolFailureBecomesTheReason) {
  request_.tokenizer = Tmp("missing.model");
  absl::StatusOr<JobTokens> r = PrepareJobTokens(request_, [] { return false; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("data.tokenizer: "));
  EXPECT_THAT(r.status().message(), HasSubstr("megatrain_tokenize: "));
  EXPECT_THAT(r.status().message(), HasSubstr("missing.model"));
}

TEST_F(JobTokensTest, ToolOfAnotherOutputVersionIsRefusedAndNothingIsKept) {
  request_.output_version = engine::kTokenizeOutputVersion + 1;
  absl::StatusOr<JobTokens> r = PrepareJobTokens(request_, [] { return false; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("writes output version ", engine::kTokenizeOutputVersion,
                                     " but this daemon expects ", request_.output_version)));
  for (const char* suffix : {".json", ".u16", ".u32", ".part"}) {
    EXPECT_FALSE(std::filesystem::exists(request_.tokens_dir + "/" + request_.key + suffix))
        << suffix;
  }
}

TEST_F(JobTokensTest, VocabularyLargerThanTheModelsNamesBoth) {
  request_.model_vocab_size = 173;
  absl::StatusOr<JobTokens> r = PrepareJobTokens(request_, [] { return false; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("vocab_size 256"));
  EXPECT_THAT(r.status().message(), HasSubstr("model's vocab_size 173"));
}

TEST_F(JobTokensTest, StopRequestCancels) {
  absl::StatusOr<JobTokens> r = PrepareJobTokens(request_, [] { return true; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_FALSE(std::filesystem::exists(request_.tokens_dir + "/" + request_.key + ".json"));
}

TEST_F(JobTokensTest, JobLinkFollowsTheNewestTokenFile) {
  absl::StatusOr<JobTokens> made = PrepareJobTokens(request_, [] { return false; });
  ASSERT_TRUE(made.ok()) << made.status();
  absl::StatusOr<std::string> link = LinkJobTokens(*made, "job-000042");
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(*link, request_.tokens_dir + "/job-000042.u16");
  EXPECT_EQ(std::filesystem::read_symlink(*link), request_.key + ".u16");
  JobTokens other = *made;
  other.path = request_.tokens_dir + "/" + std::string(64, 'b') + ".u16";
  std::filesystem::copy_file(made->path, other.path);
  ASSERT_TRUE(LinkJobTokens(other, "job-000042").ok());
  EXPECT_EQ(std::filesystem::read_symlink(*link), std::string(64, 'b') + ".u16");
  EXPECT_FALSE(std::filesystem::exists(*link + ".tmp"));
}

// Issue 16, point 1: the tokens directory sits in the job's output directory, which group members
// may write to. Symlinks planted at the names the daemon (and its tool) used for temporaries are
// never written through, and a FIFO planted as the report never blocks the runner.
TEST_F(JobTokensTest, PlantedSymlinksAndFifosAreNeverFollowed) {
  std::filesystem::create_directories(request_.tokens_dir);
  const std::string victim = Tmp("tokens_victim");
  std::ofstream(victim) << "precious";
  const std::string stem = request_.tokens_dir + "/" + request_.key;
  for (const char* name : {".json.tmp", ".part.tmp"}) {
    std::filesystem::create_symlink(victim, stem + name);
  }
  ASSERT_EQ(::mkfifo((stem + ".json").c_str(), 0600), 0);  // no reader/writer: open would block
  absl::StatusOr<JobTokens> made = PrepareJobTokens(request_, [] { return false; });
  ASSERT_TRUE(made.ok()) << made.status();
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  struct stat st;
  ASSERT_EQ(::lstat((stem + ".json").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the FIFO is replaced by the report";
  ASSERT_EQ(::lstat(made->path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// Issue 16: the key is a hash of public inputs, so anyone who can write into the tokens
// directory could plant a token file under it. Files are reused only from a directory this
// daemon owns and no one else may write to.
TEST_F(JobTokensTest, NothingIsReusedFromADirectoryOthersCanWriteTo) {
  absl::StatusOr<JobTokens> made = PrepareJobTokens(request_, [] { return false; });
  ASSERT_TRUE(made.ok()) << made.status();
  std::filesystem::permissions(request_.tokens_dir, std::filesystem::perms::group_write,
                               std::filesystem::perm_options::add);
  JobTokensRequest again = request_;
  again.tokenize_binary = "/no/such/megatrain_tokenize";
  absl::StatusOr<JobTokens> reused = PrepareJobTokens(again, [] { return false; });
  EXPECT_EQ(reused.status().code(), absl::StatusCode::kFailedPrecondition) << reused.status();
  EXPECT_THAT(reused.status().message(), HasSubstr("/no/such/megatrain_tokenize"));

  std::filesystem::permissions(request_.tokens_dir, std::filesystem::perms::group_write,
                               std::filesystem::perm_options::remove);
  reused = PrepareJobTokens(again, [] { return false; });
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_TRUE(reused->reused);
}

TEST(TokenFileKeyTest, HashesOfToolVersionTokenizerAndDataInOrder) {
  using provenance::InputFile;
  const InputFile tok{provenance::kRoleTokenizer, "/t.model", std::string(64, '1'), 5};
  const InputFile a{provenance::kRoleData, "/a.txt", std::string(64, '2'), 7};
  const InputFile b{provenance::kRoleData, "/b.txt", std::string(64, '3'), 9};
  const InputFile base{provenance::kRoleBaseModel, "/m/w.safetensors", std::string(64, '4'), 3};
  const std::string key = TokenFileKey(1, {tok, a, b});
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(TokenFileKey(1, {a, tok, b, base}), key);  // tokenizer first; other roles ignored
  EXPECT_NE(TokenFileKey(1, {tok, b, a}), key);        // the data order is the token order
  InputFile moved = a;
  moved.path = "/elsewhere/a.txt";  // same bytes elsewhere: same tokens
  EXPECT_EQ(TokenFileKey(1, {tok, moved, b}), key);
  InputFile changed = a;
  changed.sha256_hex = std::string(64, '5');
  EXPECT_NE(TokenFileKey(1, {tok, changed, b}), key);
  // A tokenizer tool that writes other tokens for the same inputs must not reuse old files.
  EXPECT_NE(TokenFileKey(2, {tok, a, b}), key);
}

}  // namespace
}  // namespace megatrain::server
