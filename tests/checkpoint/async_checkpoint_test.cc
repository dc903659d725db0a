// Checkpoints written while training continues: the steps that run beside the
// writer give bitwise the results of a run without checkpoints, and the
// checkpoint's files are byte-identical to a synchronous checkpoint of the
// same step.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/checkpoint/async_checkpoint_writer.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/train/trainer.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

enum class Mode { kNone, kSync, kAsync };

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> masters;
  std::string checkpoint;
};

RunResult Train(Mode mode, const std::string& root) {
  RunResult run;
  TinyShape shape;
  shape.layers = 5;
  auto device = MakeCpuDevice(size_t{64} << 20);
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 21;
  o.lr.peak_lr = 3e-3;
  o.lr.total_steps = 6;
  o.executor.weight_slots = 2;
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(9);
  const auto batches = MakeTokenBatches(6, 42, shape.vocab, 4);
  AsyncCheckpointWriter writer;
  for (int step = 0; step < 6; ++step) {
    auto r = (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
    EXPECT_TRUE(r.ok()) << r.status();
    run.losses.push_back(r->loss);
    if (step == 2 && mode == Mode::kSync) {
      auto path = WriteCheckpoint(**trainer, root, CheckpointRunInfo{});
      EXPECT_TRUE(path.ok()) << path.status();
      run.checkpoint = *path;
    }
    if (step == 2 && mode == Mode::kAsync) {
      EXPECT_TRUE(writer.Start(**trainer, root, CheckpointRunInfo{}).ok());
    }
  }
  if (mode == Mode::kAsync) {
    auto path = writer.Wait();
    EXPECT_TRUE(path.ok()) << path.status();
    EXPECT_TRUE(path->has_value());
    run.checkpoint = path->value_or("");
  }
  (*trainer)->WaitForUpdates();
  for (int e = 0; e < (*trainer)->store().num_entries(); ++e) {
    const float* p = (*trainer)->store().entry(e).master;
    run.masters.emplace_back(p, p + (*trainer)->store().spec(e).elements);
  }
  return run;
}

TEST(AsyncCheckpointTest, WritingBesideTrainingChangesNothing) {
  const std::string tmp = ::testing::TempDir() + "/async_checkpoint";
  std::filesystem::remove_all(tmp);
  const RunResult plain = Train(Mode::kNone, tmp + "/none");
  const RunResult sync_run = Train(Mode::kSync, tmp + "/sync");
  const RunResult async_run = Train(Mode::kAsync, tmp + "/async");
  for (const RunResult* run : {&sync_run, &async_run}) {
    ASSERT_EQ(run->losses.size(), plain.losses.size());
    for (size_t s = 0; s < plain.losses.size(); ++s) {
      EXPECT_EQ(std::memcmp(&run->losses[s], &plain.losses[s], sizeof(double)), 0) << s;
    }
    for (size_t e = 0; e < plain.masters.size(); ++e) {
      EXPECT_EQ(std::memcmp(run->masters[e].data(), plain.masters[e].data(),
                            plain.masters[e].size() * sizeof(float)),
                0)
          << "entry " << e;
    }
  }
  ASSERT_FALSE(async_run.checkpoint.empty());
  for (const char* file :
       {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
    const std::string a = ReadFile(async_run.checkpoint + "/" + file);
    EXPECT_FALSE(a.empty()) << file;
    EXPECT_EQ(a, ReadFile(sync_run.checkpoint + "/" + file)) << file << " differs";
  }
}

}  // namespace
}  // namespace megatrain::engine
