// Bitwise resume on the CPU device: 6 uninterrupted steps equal 3 steps, a
// checkpoint, a new device and trainer loading it, and 3 more steps — the
// losses, the fp32 masters and AdamW m and v, and the data cursor — with and
// without gradient accumulation.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/data/token_windows.h"
#include "engine/device/cpu_device.h"
#include "engine/train/trainer.h"

namespace megatrain::engine {
namespace {

constexpr int kSeqLen = 19;
constexpr int kMicro = 2;
constexpr int kSteps = 6;
constexpr uint64_t kSeed = 11;

ModelConfig Config() {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      R"({"model_type": "llama", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 88,
          "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
          "max_position_embeddings": 128, "rms_norm_eps": 1e-5})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<int32_t> Tokens() {
  std::vector<int32_t> t(3001);
  uint64_t s = 5;
  for (int32_t& x : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((s >> 33) % 97);
  }
  return t;
}

struct TrainingRun {
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<TokenWindows> windows;
  std::vector<double> losses;
};

TrainingRun Start() {
  TrainingRun r;
  DeviceOptions o;
  o.arena_bytes = 64 << 20;
  o.pinned_budget_bytes = 512 << 20;
  auto device = CpuDevice::Create(o);
  EXPECT_TRUE(device.ok());
  r.device = std::move(*device);
  TrainerOptions t;
  t.micro_batch_size = kMicro;
  t.seq_len = kSeqLen;
  t.head_chunk = 13;
  t.lr.peak_lr = 5e-3;
  t.lr.warmup_steps = 2;
  t.lr.total_steps = kSteps;
  t.grad_clip = 0.5;
  t.executor.checkpoint_interval = 2;
  auto trainer = Trainer::Create(*r.device, Config(), t);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  r.trainer = std::move(*trainer);
  r.trainer->InitializeRandom(kSeed);
  auto windows = TokenWindows::Create(Tokens(), kSeqLen, 0.1, kSeed);
  EXPECT_TRUE(windows.ok());
  r.windows = std::make_unique<TokenWindows>(std::move(*windows));
  return r;
}

void Steps(TrainingRun& r, int count, int accumulation) {
  for (int s = 0; s < count; ++s) {
    std::vector<WindowBatch> batches;
    std::vector<const int32_t*> in, tg;
    for (int m = 0; m < accumulation; ++m) batches.push_back(*r.windows->NextTrainBatch(kMicro));
    for (const WindowBatch& b : batches) {
      in.push_back(b.inputs.data());
      tg.push_back(b.targets.data());
    }
    auto report = r.trainer->Step(in, tg);
    ASSERT_TRUE(report.ok()) << report.status();
    r.losses.push_back(report->loss);
  }
}

std::vector<float> State(TrainingRun& r) {
  r.trainer->WaitForUpdates();
  std::vector<float> out;
  ParameterStore& store = r.trainer->mutable_store();
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    for (const float* p : {b.master, b.m, b.v}) out.insert(out.end(), p, p + b.elements);
  }
  return out;
}

class ResumeTest : public ::testing::TestWithParam<int> {};

TEST_P(ResumeTest, ResumedRunIsBitwiseTheUninterruptedRun) {
  const int accumulation = GetParam();
  const std::string root = absl::StrCat(::testing::TempDir(), "/resume_", accumulation);
  std::filesystem::remove_all(root);

  TrainingRun straight = Start();
  Steps(straight, kSteps, accumulation);
  const std::vector<float> want = State(straight);

  TrainingRun first = Start();
  Steps(first, kSteps / 2, accumulation);
  CheckpointRunInfo info;
  info.data_cursor = first.windows->cursor();
  info.seed = kSeed;
  auto dir = WriteCheckpoint(*first.trainer, root, info);
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::vector<double> first_losses = first.losses;
  // The process "ends": trainer, device and data are gone.
  first.trainer.reset();
  first.device.reset();
  first.windows.reset();

  TrainingRun second = Start();
  second.trainer->InitializeRandom(kSeed + 1);  // whatever it starts with is overwritten
  auto loaded = LoadCheckpoint(*dir, *second.trainer);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.data_cursor, static_cast<uint64_t>(kSteps / 2 * accumulation * kMicro));
  second.windows->set_cursor(loaded->state.data_cursor);
  second.losses = first_losses;
  Steps(second, kSteps - kSteps / 2, accumulation);
  EXPECT_EQ(second.trainer->progress().step, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(second.windows->cursor(), straight.windows->cursor());

  ASSERT_EQ(second.losses.size(), straight.losses.size());
  for (size_t i = 0; i < straight.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&second.losses[i], &straight.losses[i], sizeof(double)), 0)
        << "step " << i + 1 << ": " << second.losses[i] << " vs " << straight.losses[i];
  }
  const std::vector<float> got = State(second);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  // The run must have moved: a resume that silently trained nothing would also "match" a no-op.
  EXPECT_NE(straight.losses.front(), straight.losses.back());
}

INSTANTIATE_TEST_SUITE_P(Accumulation, ResumeTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace megatrain::engine
