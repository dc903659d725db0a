// Every per-parameter array on NVMe: the gradients (written by backward's
// copy-out chunk by chunk, read back by the optimizer) with the master, m and
// v, in chunks smaller than an entry. Losses, weights, optimizer state and
// gradients are bitwise those of the all-RAM run whatever the chunk size,
// resume from a checkpoint taken this way is bitwise, and an I/O error at the
// new reads and writes fails the step naming gradients.bin and an offset while
// the last checkpoint still loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/tiers/fault_injecting_block_io.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "tests/tiers/tiered_training.h"

namespace megatrain::engine {
namespace {

using namespace tiered_training;  // NOLINT: the shared fixtures of this folder

// The smallest chunk (the gradient norm's 64 Ki elements): a decoder layer of
// DeepNarrow (about 185 Ki elements) is three chunks, the last one short.
constexpr size_t kSmallChunk = size_t{256} << 10;

TrainerOptions EverythingOnNvme(const std::string& dir, size_t chunk_bytes) {
  TrainerOptions o = TieredOptions(2);  // staging: 5 slots of four arrays of a layer
  o.memory.master_on_nvme = true;
  o.memory.grad_on_nvme = true;
  o.memory.nvme_chunk_bytes = chunk_bytes;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes *= 3;  // master, m, v and the gradients
  return o;
}

void ExpectBitwise(const Outcome& in_ram, const Outcome& tiered) {
  ASSERT_EQ(tiered.losses.size(), in_ram.losses.size());
  for (size_t s = 0; s < in_ram.losses.size(); ++s) {
    EXPECT_EQ(std::memcmp(&in_ram.losses[s], &tiered.losses[s], sizeof(double)), 0)
        << "step " << s << ": " << in_ram.losses[s] << " vs " << tiered.losses[s];
  }
  ExpectSameState(in_ram, tiered);
  EXPECT_EQ(in_ram.probe_tensor, tiered.probe_tensor);
  ASSERT_EQ(in_ram.probe_gradient.size(), tiered.probe_gradient.size());
  EXPECT_EQ(std::memcmp(in_ram.probe_gradient.data(), tiered.probe_gradient.data(),
                        in_ram.probe_gradient.size() * sizeof(float)),
            0);
}

TEST(EverythingOnNvmeTest, GradientsMasterAndStatesOnNvmeAreBitwiseIdenticalForAnyChunk) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_on_nvme", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);

  for (size_t chunk : {kSmallChunk, 3 * kSmallChunk, size_t{64} << 20}) {
    SCOPED_TRACE(chunk);
    const TrainerOptions o = EverythingOnNvme(dir, chunk);
    {
      auto device = MakeCpuDevice(size_t{32} << 20);
      auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      const ParameterStore& store = (*trainer)->store();
      const int layer = (*trainer)->layout().layer_entry(3);
      EXPECT_TRUE(store.grad_on_nvme(layer));
      EXPECT_EQ(store.entry(layer).grad, nullptr);
      // The embedding's gradient is a scatter-add of rows on the host: it stays in RAM.
      EXPECT_FALSE(store.grad_on_nvme((*trainer)->layout().embedding_entry()));
      const std::string& table = (*trainer)->placement_table();
      EXPECT_NE(table.find("grad          nvme"), std::string::npos) << table;
      if (chunk == kSmallChunk) EXPECT_GE(store.chunks().num_chunks(layer), 3);
    }
    const Outcome tiered = TrainFiveSteps(o);
    ExpectBitwise(in_ram, tiered);
    EXPECT_LE(tiered.pageable_bytes, o.memory.budgets.ram);
  }
}

TEST(EverythingOnNvmeTest, GradientsAloneOnNvmeAreBitwiseIdentical) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("grad_on_nvme", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  TrainerOptions o = TieredOptions(1);
  o.memory.grad_on_nvme = true;  // m and v come along (they move first)
  o.memory.nvme_chunk_bytes = 2 * kSmallChunk;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes *= 2;
  ExpectBitwise(in_ram, TrainFiveSteps(o));
}

TEST(EverythingOnNvmeTest, ResumeFromACheckpointTakenWithEverythingOnNvmeIsBitwise) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_on_nvme_resume", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  std::string checkpoint;
  {
    std::filesystem::create_directories(dir + "/first");
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()),
                                   EverythingOnNvme(dir + "/first", kSmallChunk));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    for (int step = 0; step < 3; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
    }
    auto written = WriteCheckpoint(**trainer, dir + "/checkpoints", CheckpointRunInfo{});
    ASSERT_TRUE(written.ok()) << written.status();
    checkpoint = *written;
  }
  // Resumed with another chunk size: the chunks are a layout of the working
  // files, not of the checkpoint.
  std::filesystem::create_directories(dir + "/second");
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()),
                                 EverythingOnNvme(dir + "/second", 3 * kSmallChunk));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto loaded = LoadCheckpoint(checkpoint, **trainer);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (int step = 3; step < 5; ++step) {
    auto r =
        (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::memcmp(&r->loss, &in_ram.losses[step], sizeof(double)), 0) << "step " << step;
  }
  ASSERT_TRUE((*trainer)->UpdateStatus().ok());
  Outcome resumed;
  ReadStore((*trainer)->store(), &resumed);
  ExpectSameState(in_ram, resumed);
}

// Trains until a step fails (at most 4 more), for a fault armed after step 1.
absl::Status StepUntilFailure(Trainer& trainer) {
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  for (int step = 1; step < 5; ++step) {
    absl::Status s =
        trainer.Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2))
            .status();
    if (!s.ok()) return s;
  }
  return trainer.UpdateStatus();
}

void FaultOnGradients(const std::string& name, tiers::IoOp op, tiers::InjectedFault fault) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir(name, &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto uring = tiers::UringBlockIo::Create();
  ASSERT_TRUE(uring.ok()) << uring.status();
  tiers::FaultInjectingBlockIo faults(**uring);
  std::filesystem::create_directories(dir + "/state");
  TrainerOptions o = EverythingOnNvme(dir + "/state", kSmallChunk);
  o.memory.block_io_for_tests = &faults;
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  ASSERT_TRUE((*trainer)->Step(batches.InputPointers(0, 2), batches.TargetPointers(0, 2)).ok());
  ASSERT_TRUE((*trainer)->UpdateStatus().ok());
  auto checkpoint = WriteCheckpoint(**trainer, dir + "/checkpoints", CheckpointRunInfo{});
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();

  // Only requests on the gradient file fail: its whole byte range, nth = 3.
  const std::string grad_path = (*trainer)->store().nvme_gradients()->path();
  faults.FailNthOfFile(op, grad_path, 3, fault);
  const absl::Status failure = StepUntilFailure(**trainer);
  ASSERT_FALSE(failure.ok()) << "a fault on the gradient file must fail the step";
  const std::string message(failure.message());
  EXPECT_NE(message.find(grad_path), std::string::npos) << message;
  EXPECT_NE(OffsetIn(message), UINT64_MAX) << message;

  auto fresh_device = MakeCpuDevice(size_t{32} << 20);
  auto fresh = Trainer::Create(*fresh_device, TinyConfig(DeepNarrow()), BaseOptions());
  ASSERT_TRUE(fresh.ok());
  auto loaded = LoadCheckpoint(*checkpoint, **fresh);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*fresh)->steps_done(), 1u);
}

TEST(EverythingOnNvmeTest, AWriteFaultOnTheGradientsFailsTheStepNamingFileAndOffset) {
  FaultOnGradients("grad_write_fault", tiers::IoOp::kWrite, tiers::InjectedFault::kEnospc);
}

TEST(EverythingOnNvmeTest, AReadFaultOnTheGradientsFailsTheStepNamingFileAndOffset) {
  FaultOnGradients("grad_read_fault", tiers::IoOp::kRead, tiers::InjectedFault::kEio);
}

}  // namespace
}  // namespace megatrain::engine
