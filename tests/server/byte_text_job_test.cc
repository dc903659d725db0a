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
#include "tests/server/engine_jobs.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {
namespace {


// A real engine whose tokenizer is the real tool, or a path where none is (in memory).
std::unique_ptr<DeviceJobEngine> MakeEngine(TestDaemon& daemon, bool with_tool) {
  return MakeDeviceEngine(daemon, with_tool ? Runfile("engine/data/megatrain_tokenize")
                                            : daemon.root() + "/no-such-dir/megatrain_tokenize");
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

// Starts `daemon` on the corpus with a real engine (kept in `engine`) using the tool or not. Use
// under ASSERT_NO_FATAL_FAILURE.
void StartOnCorpus(TestDaemon& daemon, bool with_tool, std::unique_ptr<DeviceJobEngine>& engine) {
  WriteCorpus(daemon.root() + "/data");
  engine = MakeEngine(daemon, with_tool);
  ASSERT_NE(engine, nullptr);
  daemon.Start(engine.get());
}

v1::JobSpec Spec(TestDaemon& daemon, uint64_t steps) {
  v1::JobSpec spec = daemon.ValidSpec(steps);
  spec.mutable_data()->add_text_files(daemon.root() + "/data/more.jsonl");
  spec.mutable_data()->set_eval_windows(2);
  spec.set_seed(11);
  return spec;
}

TEST(ByteTextJobTest, TextIsStreamedIntoATokenFileWithTheInMemoryLosses) {
  TestDaemon in_memory("bytes_in_memory");
  std::unique_ptr<DeviceJobEngine> memory_engine;
  ASSERT_NO_FATAL_FAILURE(StartOnCorpus(in_memory, false, memory_engine));
  const v1::JobSpec memory_spec = Spec(in_memory, 6);
  in_memory.AwaitState(Submit(in_memory, memory_spec), v1::SUCCEEDED, 6, 120);
  EXPECT_TRUE(DirEntries(memory_spec.output_dir() + "/tokens").empty());

  TestDaemon streamed("bytes_streamed");
  std::unique_ptr<DeviceJobEngine> tool_engine;
  ASSERT_NO_FATAL_FAILURE(StartOnCorpus(streamed, true, tool_engine));
  const v1::JobSpec spec = Spec(streamed, 6);
  const std::string id = Submit(streamed, spec);
  streamed.AwaitState(id, v1::SUCCEEDED, 6, 120);
  // <key>.json (the tool's report), <key>.u16, and the job's link to it; no temporary left.
  const std::string tokens_dir = spec.output_dir() + "/tokens";
  std::vector<std::string> names;
  ASSERT_NO_FATAL_FAILURE(ExpectTokenFiles(tokens_dir, id, ".u16", names));
  const nlohmann::json report = ReadJson(tokens_dir + "/" + names[0]);
  EXPECT_EQ(report.value("documents", 0), 350);
  EXPECT_EQ(report.value("vocab_size", 0), 256);

  ExpectSameResults(Result(memory_spec), Result(spec),
                    {"initial_validation_loss", "final_train_loss", "final_validation_loss",
                     "unigram_entropy_nats"});
  EXPECT_GT(Result(spec)["unigram_entropy_nats"].get<double>(), 1.0);
}

TEST(ByteTextJobTest, ACheckpointTakenInMemoryResumesFromTheTokenFileBitwise) {
  // The reference: the same job straight through, in memory (its own daemon: the other one
  // holds its jobs).
  TestDaemon reference("bytes_straight");
  std::unique_ptr<DeviceJobEngine> reference_engine;
  ASSERT_NO_FATAL_FAILURE(StartOnCorpus(reference, false, reference_engine));
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
  const v1::Job paused = PauseWhenHeld(daemon, id, 3, 120);
  ASSERT_FALSE(paused.progress().last_checkpoint().empty());
  ASSERT_EQ(paused.progress().step(), 3u);
  EXPECT_TRUE(DirEntries(spec.output_dir() + "/tokens").empty());

  daemon.Restart(tool_engine.get());
  ASSERT_TRUE(Resume(daemon, id).ok());
  daemon.AwaitState(id, v1::SUCCEEDED, 40, 120);
  EXPECT_EQ(DirEntries(spec.output_dir() + "/tokens").size(), 3u);
  const nlohmann::json resumed = Result(spec);
  ASSERT_NO_FATAL_FAILURE(ExpectSameResults(resumed, Result(straight),
                                            {"final_train_loss", "final_validation_loss"}));
  EXPECT_EQ(resumed["resumed_from_step"].get<uint64_t>(), paused.progress().step());
}

}  // namespace
}  // namespace megatrain::server::testing
