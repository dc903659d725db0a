// Daemon jobs on text with the byte tokenizer (in-process daemon, real DeviceJobEngine): the
// text is streamed into a token file by megatrain_tokenize in a child process (issue 16, point
// 6), the job ends with exactly the losses and corpus entropy of the same job tokenized in
// memory (the daemon's way when the tool is missing, and its only way before), and a job
// checkpointed when its text was tokenized in memory resumes bitwise from a token file.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/job_engine.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {
namespace {

using ::testing::MatchesRegex;

// A real engine whose tokenizer is the real tool, or a path where none is (in memory).
std::unique_ptr<DeviceJobEngine> MakeEngine(TestDaemon& daemon, bool with_tool) {
  DeviceJobEngineOptions options;
  options.state_dir = daemon.settings().state_dir;
  options.device = daemon.settings().device;
  options.tokenize_binary = with_tool ? Runfile("engine/data/megatrain_tokenize")
                                      : daemon.root() + "/no-such-dir/megatrain_tokenize";
  absl::StatusOr<std::unique_ptr<DeviceJobEngine>> engine = DeviceJobEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Some hundred fortunes with a JSONL file beside them: both readers stream.
void WriteCorpus(const std::string& data_dir) {
  std::ofstream fortunes(data_dir + "/corpus.txt");
  for (int i = 1; i <= 300; ++i) {
    fortunes << "Fortune " << i << ": a stitch in time saves " << i * 9 << ".\n%\n";
  }
  std::ofstream jsonl(data_dir + "/more.jsonl");
  for (int i = 1; i <= 50; ++i) jsonl << "{\"text\": \"line " << i << " of \\u00e9t\\u00e9\"}\n";
}

v1::JobSpec Spec(TestDaemon& daemon, uint64_t steps) {
  v1::JobSpec spec = daemon.ValidSpec(steps);
  spec.mutable_data()->add_text_files(daemon.root() + "/data/more.jsonl");
  spec.mutable_data()->set_eval_windows(2);
  spec.set_seed(11);
  return spec;
}

std::string Submit(TestDaemon& daemon, const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::ClientContext context;
  const grpc::Status s = daemon.stub().SubmitJob(&context, request, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job.id();
}

grpc::Status Control(TestDaemon& daemon, const std::string& id, bool pause) {
  grpc::ClientContext context;
  v1::Job job;
  if (pause) {
    v1::JobRef r;
    r.set_id(id);
    return daemon.stub().PauseJob(&context, r, &job);
  }
  v1::ResumeJobRequest r;
  r.set_id(id);
  return daemon.stub().ResumeJob(&context, r, &job);
}

nlohmann::json Result(const v1::JobSpec& spec) {
  return nlohmann::json::parse(ReadAll(spec.output_dir() + "/result.json"), nullptr, false);
}

void ExpectSameRun(const nlohmann::json& a, const nlohmann::json& b) {
  ASSERT_TRUE(a.is_object() && b.is_object());
  for (const char* key : {"initial_validation_loss", "final_train_loss", "final_validation_loss",
                          "unigram_entropy_nats"}) {
    EXPECT_EQ(a[key].get<double>(), b[key].get<double>()) << key;
  }
}

TEST(ByteTextJobTest, TextIsStreamedIntoATokenFileWithTheInMemoryLosses) {
  TestDaemon in_memory("bytes_in_memory");
  WriteCorpus(in_memory.root() + "/data");
  std::unique_ptr<DeviceJobEngine> memory_engine = MakeEngine(in_memory, false);
  ASSERT_NE(memory_engine, nullptr);
  in_memory.Start(memory_engine.get());
  const v1::JobSpec memory_spec = Spec(in_memory, 6);
  in_memory.AwaitState(Submit(in_memory, memory_spec), v1::SUCCEEDED, 6, 120);
  EXPECT_TRUE(DirEntries(memory_spec.output_dir() + "/tokens").empty());

  TestDaemon streamed("bytes_streamed");
  WriteCorpus(streamed.root() + "/data");
  std::unique_ptr<DeviceJobEngine> tool_engine = MakeEngine(streamed, true);
  ASSERT_NE(tool_engine, nullptr);
  streamed.Start(tool_engine.get());
  const v1::JobSpec spec = Spec(streamed, 6);
  const std::string id = Submit(streamed, spec);
  streamed.AwaitState(id, v1::SUCCEEDED, 6, 120);
  // <key>.json (the tool's report), <key>.u16, and the job's link to it; no temporary left.
  const std::string tokens_dir = spec.output_dir() + "/tokens";
  const std::vector<std::string> names = DirEntries(tokens_dir);
  ASSERT_EQ(names.size(), 3u) << ::testing::PrintToString(names);
  EXPECT_THAT(names[0], MatchesRegex("[0-9a-f]{64}\\.json"));
  EXPECT_THAT(names[1], MatchesRegex("[0-9a-f]{64}\\.u16"));
  EXPECT_EQ(names[2], id + ".u16");
  const nlohmann::json report =
      nlohmann::json::parse(ReadAll(tokens_dir + "/" + names[0]), nullptr, false);
  EXPECT_EQ(report.value("documents", 0), 350);
  EXPECT_EQ(report.value("vocab_size", 0), 256);

  ExpectSameRun(Result(memory_spec), Result(spec));
  EXPECT_GT(Result(spec)["unigram_entropy_nats"].get<double>(), 1.0);
}

TEST(ByteTextJobTest, ACheckpointTakenInMemoryResumesFromTheTokenFileBitwise) {
  // The reference: the same job straight through, in memory (its own daemon: the other one
  // holds its jobs).
  TestDaemon reference("bytes_straight");
  WriteCorpus(reference.root() + "/data");
  std::unique_ptr<DeviceJobEngine> reference_engine = MakeEngine(reference, false);
  ASSERT_NE(reference_engine, nullptr);
  reference.Start(reference_engine.get());
  const v1::JobSpec straight = Spec(reference, 40);
  reference.AwaitState(Submit(reference, straight), v1::SUCCEEDED, 40, 120);

  // Held after step 3 (the runner's test hook, on state: whatever the machine's speed, the job
  // is still running when paused), paused (a checkpoint, in memory), then the daemon restarts
  // with the tool and the job resumes from that checkpoint on a token file.
  TestDaemon daemon("bytes_resume");
  WriteCorpus(daemon.root() + "/data");
  daemon.settings().test_hold_after_step = 3;
  std::unique_ptr<DeviceJobEngine> memory_engine = MakeEngine(daemon, false);
  std::unique_ptr<DeviceJobEngine> tool_engine = MakeEngine(daemon, true);
  ASSERT_NE(memory_engine, nullptr);
  ASSERT_NE(tool_engine, nullptr);
  daemon.Start(memory_engine.get());
  const v1::JobSpec spec = Spec(daemon, 40);
  const std::string id = Submit(daemon, spec);
  daemon.AwaitState(id, v1::RUNNING, 3, 120);
  ASSERT_TRUE(Control(daemon, id, /*pause=*/true).ok());
  const v1::Job paused = daemon.AwaitState(id, v1::PAUSED, 0, 120);
  ASSERT_FALSE(paused.progress().last_checkpoint().empty());
  ASSERT_EQ(paused.progress().step(), 3u);
  EXPECT_TRUE(DirEntries(spec.output_dir() + "/tokens").empty());

  daemon.Restart(tool_engine.get());
  ASSERT_TRUE(Control(daemon, id, /*pause=*/false).ok());
  daemon.AwaitState(id, v1::SUCCEEDED, 40, 120);
  EXPECT_EQ(DirEntries(spec.output_dir() + "/tokens").size(), 3u);
  const nlohmann::json resumed = Result(spec);
  ASSERT_TRUE(resumed.is_object());
  EXPECT_EQ(resumed["resumed_from_step"].get<uint64_t>(), paused.progress().step());
  EXPECT_EQ(resumed["final_train_loss"].get<double>(),
            Result(straight)["final_train_loss"].get<double>());
  EXPECT_EQ(resumed["final_validation_loss"].get<double>(),
            Result(straight)["final_validation_loss"].get<double>());
}

}  // namespace
}  // namespace megatrain::server::testing
