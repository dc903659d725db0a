// The memory tiers inside the trainer: a model whose AdamW state is more than
// 4x the RAM budget trains with m and v (and, asked, the fp32 master) on an
// NVMe file (O_DIRECT, io_uring) and gives bitwise the losses, weights and
// optimizer state of the all-RAM run, also across a checkpoint and resume;
// disk faults fail the step naming file and offset; budgets that cannot hold
// the model are refused up front with what is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/tiers/fault_injecting_block_io.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "engine/train/trainer.h"
#include "tests/tiers/tiered_training.h"

namespace megatrain::engine {
namespace {

using namespace tiered_training;  // NOLINT: the shared fixtures of this folder
using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;


TEST(TrainerTiersTest, OptimizerStateOnNvmeFourTimesTheRamBudgetIsBitwiseIdentical) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_tiers", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;

  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);

  TrainerOptions o = TieredOptions(4);
  o.memory.budgets.nvme_dir = dir;
  const Outcome on_nvme = TrainFiveSteps(o);
  ASSERT_EQ(on_nvme.losses.size(), 5u);
  EXPECT_LE(on_nvme.pageable_bytes, o.memory.budgets.ram);
  EXPECT_GE(StateBytes(BaseOptions()), 4 * o.memory.budgets.ram);  // state >= 4x the RAM budget

  for (int s = 0; s < 5; ++s) {
    EXPECT_EQ(std::memcmp(&in_ram.losses[s], &on_nvme.losses[s], sizeof(double)), 0)
        << "step " << s << ": " << in_ram.losses[s] << " vs " << on_nvme.losses[s];
  }
  ExpectSameState(in_ram, on_nvme);
}

TEST(TrainerTiersTest, MasterAndStatesOnNvmeAreBitwiseIdenticalToTheAllRamRun) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_tiers_master", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;

  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);

  TrainerOptions o = TieredOptions(2);
  o.memory.master_on_nvme = true;
  o.memory.budgets.nvme_dir = dir;
  {
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const ParameterStore& store = (*trainer)->store();
    ASSERT_TRUE(store.master_on_nvme());
    EXPECT_EQ(store.state_store()->arrays_per_entry(), 3);
    EXPECT_EQ(store.entry(0).master, nullptr);
    EXPECT_NE(store.entry(0).compute_fp32, nullptr);
    const std::string& table = (*trainer)->placement_table();
    EXPECT_NE(table.find("master        nvme"), std::string::npos) << table;
    EXPECT_NE(table.find("fp32"), std::string::npos) << table;
  }
  const Outcome on_nvme = TrainFiveSteps(o);
  ASSERT_EQ(on_nvme.losses.size(), 5u);
  EXPECT_LE(on_nvme.pageable_bytes, o.memory.budgets.ram);
  for (int s = 0; s < 5; ++s) {
    EXPECT_EQ(std::memcmp(&in_ram.losses[s], &on_nvme.losses[s], sizeof(double)), 0)
        << "step " << s << ": " << in_ram.losses[s] << " vs " << on_nvme.losses[s];
  }
  ExpectSameState(in_ram, on_nvme);
  ASSERT_EQ(in_ram.probe_tensor.size(), on_nvme.probe_tensor.size());
  EXPECT_EQ(std::memcmp(in_ram.probe_tensor.data(), on_nvme.probe_tensor.data(),
                        in_ram.probe_tensor.size() * sizeof(float)),
            0);
}

// The same tiers before and after a checkpoint (model files in `dtype`),
// each run with its own NVMe directory.
void CheckpointAndResume(const std::string& name, bool master_on_nvme, SafetensorsDtype dtype) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir(name, &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  TrainerOptions first = TieredOptions(2);
  first.memory.states_on_nvme = true;
  first.memory.master_on_nvme = master_on_nvme;
  first.memory.budgets.nvme_dir = dir + "/first";
  TrainerOptions second = first;
  second.memory.budgets.nvme_dir = dir + "/second";
  CheckpointOptions checkpoint_options;
  checkpoint_options.model_dtype = dtype;
  ExpectBitwiseResume(dir, first, second, checkpoint_options);
}

TEST(TrainerTiersTest, CheckpointAndResumeWithMasterOnNvmeIsBitwiseIdentical) {
  CheckpointAndResume("trainer_tiers_master_resume", true, SafetensorsDtype::kF32);
}

TEST(TrainerTiersTest, Bf16CheckpointCarriesTheNvmeMasterInTheOptimizerFile) {
  CheckpointAndResume("trainer_tiers_master_resume_bf16", true, SafetensorsDtype::kBF16);
}

TEST(TrainerTiersTest, HfExportAndLoadGoThroughTheNvmeMaster) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_tiers_master_hf", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);

  TrainerOptions o = TieredOptions(2);
  o.memory.master_on_nvme = true;
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  {
    o.memory.budgets.nvme_dir = dir + "/first";
    std::filesystem::create_directories(o.memory.budgets.nvme_dir);
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    for (int step = 0; step < 5; ++step) {
      ASSERT_TRUE(
          (*trainer)
              ->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2))
              .ok());
    }
    ASSERT_TRUE(ExportHfModel(**trainer, dir + "/hf", SafetensorsDtype::kF32).ok());
  }
  // A fresh trainer loads the export into its NVMe masters: they equal the
  // all-RAM run's, its gradients are zero, and it computes from them.
  o.memory.budgets.nvme_dir = dir + "/second";
  std::filesystem::create_directories(o.memory.budgets.nvme_dir);
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->LoadHfWeights(dir + "/hf").ok());
  const ParameterStore& store = (*trainer)->store();
  for (int e = 0; e < store.num_entries(); ++e) {
    const size_t n = store.spec(e).elements;
    std::vector<float> master(n);
    ASSERT_TRUE(store.ReadMaster(e, master.data()).ok());
    EXPECT_EQ(std::memcmp(master.data(), in_ram.masters[e].data(), n * 4), 0) << e;
    EXPECT_EQ(std::memcmp(store.entry(e).compute_fp32, master.data(), n * 4), 0) << e;
    EXPECT_EQ(std::count(store.entry(e).grad, store.entry(e).grad + n, 0.0f),
              static_cast<std::ptrdiff_t>(n))
        << e;
  }
  auto tensor = (*trainer)->ReadTensor(kProbeTensor);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(*tensor, in_ram.probe_tensor);
}

TEST(TrainerTiersTest, AReadFaultOnTheMasterArrayFailsTheStepNamingFileAndOffset) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_tiers_master_fault", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto uring = tiers::UringBlockIo::Create();
  ASSERT_TRUE(uring.ok()) << uring.status();
  tiers::FaultInjectingBlockIo faults(**uring);

  TrainerOptions o = TieredOptions(2);
  o.memory.master_on_nvme = true;
  o.memory.budgets.nvme_dir = dir;
  o.memory.block_io_for_tests = &faults;
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  ASSERT_TRUE((*trainer)->Step(batches.InputPointers(0, 2), batches.TargetPointers(0, 2)).ok());
  (*trainer)->WaitForUpdates();

  // Layer 9's entry is m, v, master of 726 KiB each: with 2 MiB requests the
  // second read request of the entry starts inside its master array.
  const tiers::NvmeStateStore& states = *(*trainer)->store().state_store();
  const int entry = (*trainer)->layout().layer_entry(9);
  const uint64_t begin = states.array_offset(entry, ParameterStore::kMasterArray);
  const uint64_t end = begin + states.array_bytes(entry);
  faults.FailNthOfRange(tiers::IoOp::kRead, begin, end, 2, tiers::InjectedFault::kEio);
  absl::Status failure;
  for (int step = 1; step < 4 && failure.ok(); ++step) {
    failure = (*trainer)
                  ->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2))
                  .status();
  }
  ASSERT_FALSE(failure.ok()) << "an EIO reading a master must fail the job";
  EXPECT_EQ(failure.code(), absl::StatusCode::kDataLoss) << failure;
  const std::string message(failure.message());
  EXPECT_NE(message.find(states.path()), std::string::npos) << message;
  const uint64_t offset = OffsetIn(message);
  EXPECT_GE(offset, begin) << message;
  EXPECT_LT(offset, end) << message;
}

TEST(TrainerTiersTest, CheckpointAndResumeWithStateOnNvmeIsBitwiseIdentical) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_tiers_resume", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  TrainerOptions first = TieredOptions(4);
  first.memory.states_on_nvme = true;
  first.memory.budgets.nvme_dir = dir + "/first";
  TrainerOptions second = first;
  second.memory.budgets.nvme_dir = dir + "/second";
  ExpectBitwiseResume(dir, first, second);
}

TEST(TrainerTiersTest, DiskFaultFailsTheStepNamingFileAndOffsetAndKeepsTheCheckpoint) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_tiers_fault", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto uring = tiers::UringBlockIo::Create();
  ASSERT_TRUE(uring.ok()) << uring.status();
  tiers::FaultInjectingBlockIo faults(**uring);

  TrainerOptions o = TieredOptions(4);
  o.memory.states_on_nvme = true;
  o.memory.budgets.nvme_dir = dir + "/state";
  o.memory.block_io_for_tests = &faults;
  std::filesystem::create_directories(o.memory.budgets.nvme_dir);
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE((*trainer)
                    ->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2))
                    .ok());
  }
  auto checkpoint = WriteCheckpoint(**trainer, dir + "/checkpoints", CheckpointRunInfo{});
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();

  // The disk fills up during the next optimizer pass (a write-back of m/v).
  faults.FailNthOf(tiers::IoOp::kWrite, 5, tiers::InjectedFault::kEnospc);
  absl::Status failure;
  for (int step = 2; step < 5 && failure.ok(); ++step) {
    failure = (*trainer)
                  ->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2))
                  .status();
  }
  ASSERT_FALSE(failure.ok()) << "an ENOSPC in the optimizer pass must fail the job";
  const std::string message(failure.message());
  EXPECT_NE(message.find(o.memory.budgets.nvme_dir), std::string::npos) << message;
  EXPECT_NE(message.find("offset"), std::string::npos) << message;

  // The last committed checkpoint is intact and loads into a fresh trainer.
  auto fresh_device = MakeCpuDevice(size_t{32} << 20);
  auto fresh = Trainer::Create(*fresh_device, TinyConfig(DeepNarrow()), BaseOptions());
  ASSERT_TRUE(fresh.ok());
  auto loaded = LoadCheckpoint(*checkpoint, **fresh);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*fresh)->steps_done(), 2u);
}

TEST(TrainerTiersTest, BudgetsThatCannotHoldTheModelAreRefusedWithWhatIsMissing) {
  TrainerOptions o = BaseOptions();
  o.memory.enabled = true;
  o.memory.budgets.pinned_ram = 1 << 20;
  o.memory.budgets.ram = 1 << 20;  // no NVMe: m and v have nowhere to go
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(trainer.status().message().find("more"), std::string::npos) << trainer.status();
}

TEST(TrainerTiersTest, TmpfsIsRefusedForTheNvmeTier) {
  TrainerOptions o = BaseOptions();
  const size_t state_bytes = StateBytes(o);
  o.memory.enabled = true;
  o.memory.states_on_nvme = true;
  o.memory.budgets.pinned_ram = state_bytes + (size_t{4} << 20);
  o.memory.budgets.ram = state_bytes;
  o.memory.budgets.nvme_dir = "/dev/shm";
  o.memory.budgets.nvme_bytes = 2 * state_bytes;
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("tmpfs"), std::string::npos) << trainer.status();
}

}  // namespace
}  // namespace megatrain::engine
