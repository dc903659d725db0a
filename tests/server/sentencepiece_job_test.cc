// Daemon jobs whose text uses a SentencePiece model (in-process daemon, real DeviceJobEngine): the
// text is tokenized by megatrain_tokenize in a child process into <output_dir>/tokens, the job
// ends with exactly the losses of a job on the token file the tool writes when run by hand, a
// resumed job reuses the token file, a vocabulary larger than the model's fails the job naming
// both, and cancelling or pausing while the tokenizer runs kills it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/child_process.h"
#include "server/job_engine.h"
#include "tests/server/engine_jobs.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

class SentencePieceJobTest : public ::testing::Test {
 protected:
  // Starts the daemon on a real engine running `tokenize_binary` (the real tool by default).
  void StartDaemon(const std::string& tokenize_binary = Runfile("engine/data/megatrain_tokenize")) {
    const std::string data = daemon_.root() + "/data";
    std::filesystem::copy_file(Runfile("tests/server/sp_fixture_corpus.txt"), data + "/sp.txt");
    std::filesystem::copy_file(Runfile("tests/server/sp_fixture.model"), data + "/sp.model");
    engine_ = MakeDeviceEngine(daemon_, tokenize_binary);
    ASSERT_NE(engine_, nullptr);
    daemon_.Start(engine_.get());
  }

  v1::JobSpec Spec(uint64_t steps) {
    v1::JobSpec spec = daemon_.ValidSpec(steps);
    spec.mutable_data()->clear_text_files();
    spec.mutable_data()->add_text_files(daemon_.root() + "/data/sp.txt");
    spec.mutable_data()->set_tokenizer(daemon_.root() + "/data/sp.model");
    spec.mutable_data()->set_eval_windows(2);
    spec.set_seed(7);
    return spec;
  }

  TestDaemon daemon_{"sentencepiece_job"};
  std::unique_ptr<DeviceJobEngine> engine_;
};

TEST_F(SentencePieceJobTest, EndsWithTheLossesOfTheToolsTokenFile) {
  StartDaemon();
  const v1::JobSpec spec = Spec(4);
  const std::string id = Submit(daemon_, spec);
  const v1::Job done = daemon_.AwaitState(id, v1::SUCCEEDED, 4, 120);
  EXPECT_EQ(done.progress().tokens(), 4u * 2 * 32);
  // <key>.json (the tool's report), <key>.u16, and the job's link to it.
  const std::string tokens_dir = spec.output_dir() + "/tokens";
  std::vector<std::string> names;
  ASSERT_NO_FATAL_FAILURE(ExpectTokenFiles(tokens_dir, id, ".u16", names));
  EXPECT_EQ(std::filesystem::read_symlink(tokens_dir + "/" + names[2]).string(), names[1]);
  const nlohmann::json report = ReadJson(tokens_dir + "/" + names[0]);
  EXPECT_EQ(report.value("vocab_size", 0), 120);
  EXPECT_EQ(report.value("out", ""), tokens_dir + "/" + names[1]);

  // The same text and model through megatrain_tokenize by hand, trained as token_files.
  const std::string direct = daemon_.root() + "/data/direct.u16";
  absl::StatusOr<ChildResult> tool = RunChildProcess(
      {Runfile("engine/data/megatrain_tokenize"), "--tokenizer=" + spec.data().tokenizer(),
       "--out=" + direct, spec.data().text_files(0)},
      [] { return false; });
  ASSERT_TRUE(tool.ok()) << tool.status();
  ASSERT_EQ(tool->exit_code, 0) << tool->err;
  EXPECT_EQ(ReadAll(direct), ReadAll(tokens_dir + "/" + names[1]));
  v1::JobSpec by_hand = Spec(4);
  by_hand.mutable_data()->clear_text_files();
  by_hand.mutable_data()->clear_tokenizer();
  by_hand.mutable_data()->add_token_files(direct);
  daemon_.AwaitState(Submit(daemon_, by_hand), v1::SUCCEEDED, 4, 120);

  const nlohmann::json a = Result(spec);
  ASSERT_NO_FATAL_FAILURE(ExpectSameResults(
      a, Result(by_hand), {"initial_validation_loss", "final_train_loss", "final_validation_loss"}));
  // Training did something on SentencePiece ids (the model sees 120 of its 256 ids).
  EXPECT_LT(a["final_train_loss"].get<double>(), a["initial_validation_loss"].get<double>());
}

TEST_F(SentencePieceJobTest, ResumeReusesTheTokenFileAndAllowedDataChangesGetANewOne) {
  StartDaemon();
  v1::JobSpec spec = Spec(5000);
  spec.mutable_checkpoints()->set_keep_last(1);
  const std::string id = Submit(daemon_, spec);
  const std::string tokens_dir = spec.output_dir() + "/tokens";
  daemon_.AwaitState(id, v1::RUNNING, 1, 120);
  const std::vector<std::string> names = DirEntries(tokens_dir);
  ASSERT_EQ(names.size(), 3u) << ::testing::PrintToString(names);
  const std::string token_file = tokens_dir + "/" + names[1];
  struct stat before {};
  ASSERT_EQ(stat(token_file.c_str(), &before), 0);

  // Paused and resumed: the runner's data check passes and the token file is reused as is.
  ASSERT_TRUE(Pause(daemon_, id).ok());
  const v1::Job paused = daemon_.AwaitState(id, v1::PAUSED, 0, 120);
  ASSERT_FALSE(paused.progress().last_checkpoint().empty());
  ASSERT_TRUE(Resume(daemon_, id).ok());
  const v1::Job resumed = daemon_.AwaitState(id, v1::RUNNING, paused.progress().step() + 1, 120);
  EXPECT_GT(resumed.progress().step(), paused.progress().step());
  struct stat after {};
  ASSERT_EQ(stat(token_file.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the resumed run tokenized again";
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  EXPECT_EQ(DirEntries(tokens_dir), names);

  // The text changes while paused; resumed with the change allowed, the run tokenizes the new
  // text into another file, and the job's link (the path its checkpoints know) follows it.
  ASSERT_TRUE(Pause(daemon_, id).ok());
  const v1::Job paused_again = daemon_.AwaitState(id, v1::PAUSED, 0, 120);
  std::ofstream(spec.data().text_files(0), std::ios::app) << "One more fortune: the end.\n%\n";
  EXPECT_EQ(Resume(daemon_, id).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  {
    grpc::ClientContext context;
    v1::ResumeJobRequest r;
    r.set_id(id);
    r.set_allow_data_change(true);
    v1::Job job;
    const grpc::Status s = daemon_.stub().ResumeJob(&context, r, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  daemon_.AwaitState(id, v1::RUNNING, paused_again.progress().step() + 1, 120);
  const std::vector<std::string> changed = DirEntries(tokens_dir);
  ASSERT_EQ(changed.size(), 5u) << ::testing::PrintToString(changed);
  const std::string target = std::filesystem::read_symlink(tokens_dir + "/" + id + ".u16");
  EXPECT_NE(target, names[1]);
  EXPECT_THAT(target, MatchesRegex("[0-9a-f]{64}\\.u16"));
  ASSERT_TRUE(Cancel(daemon_, id).ok());
  daemon_.AwaitState(id, v1::CANCELLED, 0, 120);
}

TEST_F(SentencePieceJobTest, VocabularyLargerThanTheModelsFailsNamingBoth) {
  StartDaemon();
  std::ofstream(daemon_.root() + "/data/small_vocab.json")
      << R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 48,
            "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256})";
  v1::JobSpec spec = Spec(4);
  spec.mutable_model()->set_config_json_path(daemon_.root() + "/data/small_vocab.json");
  const v1::Job failed = daemon_.AwaitState(Submit(daemon_, spec), v1::FAILED, 0, 120);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("data.tokenizer"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("vocab_size 120"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("model's vocab_size 100"));
}

TEST_F(SentencePieceJobTest, MissingTokenizerIsRefusedAtSubmit) {
  StartDaemon();
  v1::JobSpec spec = Spec(4);
  spec.mutable_data()->set_tokenizer(daemon_.root() + "/data/none.model");
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::ClientContext context;
  const grpc::Status s = daemon_.stub().SubmitJob(&context, request, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("data.tokenizer"));
}

// A stand-in tokenizer that reports its pid through a FIFO, then sleeps for ten minutes.
class StuckTokenizerTest : public SentencePieceJobTest {
 protected:
  void SetUp() override {
    fifo_ = daemon_.root() + "/pid.fifo";
    ASSERT_EQ(mkfifo(fifo_.c_str(), 0600), 0);
    reader_ = open(fifo_.c_str(), O_RDONLY | O_NONBLOCK);
    ASSERT_GE(reader_, 0);
    const std::string script = daemon_.root() + "/stuck_tokenize";
    std::ofstream(script) << "#!/bin/sh\necho $$ > " << fifo_ << "\nexec sleep 600\n";
    std::filesystem::permissions(script, std::filesystem::perms::owner_all);
    StartDaemon(script);
  }
  void TearDown() override { close(reader_); }

  // Bounded: the pid the stand-in wrote, or 0 after 60 s.
  pid_t AwaitTokenizerPid() {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (text.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{reader_, POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) continue;
      char buffer[32];
      const ssize_t n = read(reader_, buffer, sizeof(buffer));
      if (n > 0) text.append(buffer, static_cast<size_t>(n));
    }
    return static_cast<pid_t>(std::atol(text.c_str()));
  }

  void ExpectGone(pid_t pid) {
    EXPECT_EQ(kill(pid, 0), -1) << "tokenizer " << pid << " survived";
    EXPECT_EQ(errno, ESRCH);
  }

  std::string fifo_;
  int reader_ = -1;
};

TEST_F(StuckTokenizerTest, CancelKillsTheTokenizer) {
  const std::string id = Submit(daemon_, Spec(4));
  const pid_t pid = AwaitTokenizerPid();
  ASSERT_GT(pid, 0) << "the tokenizer did not start";
  ASSERT_TRUE(Cancel(daemon_, id).ok());
  daemon_.AwaitState(id, v1::CANCELLED, 0, 30);
  ExpectGone(pid);
}

TEST_F(StuckTokenizerTest, PauseKillsTheTokenizer) {
  const std::string id = Submit(daemon_, Spec(4));
  const pid_t pid = AwaitTokenizerPid();
  ASSERT_GT(pid, 0) << "the tokenizer did not start";
  ASSERT_TRUE(Pause(daemon_, id).ok());
  const v1::Job paused = daemon_.AwaitState(id, v1::PAUSED, 0, 30);
  EXPECT_EQ(paused.progress().step(), 0u);
  ExpectGone(pid);
}

TEST_F(StuckTokenizerTest, ShutdownKillsTheTokenizerAndRequeuesTheJob) {
  const std::string id = Submit(daemon_, Spec(4));
  const pid_t pid = AwaitTokenizerPid();
  ASSERT_GT(pid, 0) << "the tokenizer did not start";
  ASSERT_TRUE(daemon_.daemon().Shutdown());
  ExpectGone(pid);
  absl::StatusOr<v1::Job> job = daemon_.daemon().runner().Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::QUEUED);
}

}  // namespace
}  // namespace megatrain::server::testing
