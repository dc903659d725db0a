// Every per-parameter array on NVMe: the gradients (written by backward's
// copy-out chunk by chunk, read back by the optimizer) and the compute copy
// (written by the optimizer, read by the weight copies in step order, through
// whole-layer slots or a fragment ring) with the master, m and v, in chunks
// smaller than an entry. Losses, weights, optimizer state and
// gradients are bitwise those of the all-RAM run whatever the chunk size,
// resume from a checkpoint taken this way is bitwise, and an I/O error at the
// new reads and writes fails the step naming gradients.bin and an offset while
// the last checkpoint still loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/checkpoint/checkpoint_directory.h"
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

// The smallest chunk (the gradient norm's 64 Ki elements): a decoder layer of
// DeepNarrow (about 185 Ki elements) is three chunks, the last one short.
constexpr size_t kSmallChunk = size_t{256} << 10;

TrainerOptions EverythingOnNvme(const std::string& dir, size_t chunk_bytes) {
  TrainerOptions o = TieredOptions(1);  // staging: 5 slots of five arrays of a layer
  o.memory.master_on_nvme = true;
  o.memory.grad_on_nvme = true;
  o.memory.compute_copy_on_nvme = true;
  o.memory.nvme_chunk_bytes = chunk_bytes;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes *= 3;  // master, m, v, the gradients and the compute copy
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
      EXPECT_TRUE(store.compute_on_nvme(layer));
      EXPECT_EQ(store.entry(layer).compute_fp32, nullptr);
      // The embedding's gradient is a scatter-add of rows on the host, its
      // compute copy is gathered by rows there: both stay in RAM.
      EXPECT_FALSE(store.grad_on_nvme((*trainer)->layout().embedding_entry()));
      EXPECT_FALSE(store.compute_on_nvme((*trainer)->layout().embedding_entry()));
      const std::string& table = (*trainer)->placement_table();
      EXPECT_NE(table.find("grad          nvme"), std::string::npos) << table;
      EXPECT_NE(table.find("compute_copy  nvme"), std::string::npos) << table;
      if (chunk == kSmallChunk) {
        EXPECT_GE(store.chunks().num_chunks(layer), 3);
      }
    }
    const Outcome tiered = TrainFiveSteps(o);
    ExpectBitwise(in_ram, tiered);
    EXPECT_LE(tiered.pageable_bytes, o.memory.budgets.ram);
  }
}

TEST(EverythingOnNvmeTest, WeightsStreamFromNvmeThroughAFragmentRing) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_on_nvme_ring", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  TrainerOptions ram = BaseOptions();
  ram.executor.weight_ring_bytes = size_t{600} << 10;  // smaller than one layer
  ram.executor.fragment_bytes = size_t{40} << 10;      // several fragments per chunk
  const Outcome in_ram = TrainFiveSteps(ram);
  ASSERT_EQ(in_ram.losses.size(), 5u);
  for (size_t chunk : {kSmallChunk, size_t{64} << 20}) {
    SCOPED_TRACE(chunk);
    TrainerOptions o = EverythingOnNvme(dir, chunk);
    o.executor.weight_ring_bytes = ram.executor.weight_ring_bytes;
    o.executor.fragment_bytes = ram.executor.fragment_bytes;
    ExpectBitwise(in_ram, TrainFiveSteps(o));
  }
  // And the same bits as whole-layer slots.
  const Outcome slots = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(slots.losses.size(), 5u);
  EXPECT_EQ(std::memcmp(slots.losses.data(), in_ram.losses.data(), 5 * sizeof(double)), 0);
}

// An untied head of 1101 rows of 136 in vocabulary blocks of 300 through a
// ring: its gradient goes to NVMe block by block, blocks 1 and 3 straddle the
// 64 Ki-float chunks of the entry (a chunk begun by one block is ended by the
// next), and the entry's padding (1101 x 136 and 136 are not multiples of 16)
// goes out zeroed with the last block and the final norm. Bitwise the all-RAM
// run, which is bitwise whole-layer slots.
TEST(EverythingOnNvmeTest, AHeadInVocabularyBlocksOffloadsItsGradientBlockByBlock) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_on_nvme_head_blocks", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  TinyShape shape = DeepNarrow();
  shape.vocab = 1101;
  shape.hidden = 136;
  TrainerOptions ram = BaseOptions();
  ram.head_block_rows = 300;
  const Outcome slots = TrainFiveSteps(ram, shape);
  ASSERT_EQ(slots.losses.size(), 5u);
  ram.executor.weight_ring_bytes = size_t{600} << 10;
  ram.executor.fragment_bytes = size_t{40} << 10;
  const Outcome in_ram = TrainFiveSteps(ram, shape);
  ExpectBitwise(slots, in_ram);
  TrainerOptions o = EverythingOnNvme(dir, kSmallChunk);
  o.head_block_rows = ram.head_block_rows;
  o.executor.weight_ring_bytes = ram.executor.weight_ring_bytes;
  o.executor.fragment_bytes = ram.executor.fragment_bytes;
  ExpectBitwise(in_ram, TrainFiveSteps(o, shape));
}

// A Hugging Face model loaded with every array on NVMe goes entry by entry
// (no RAM array of an entry's size exists): every tensor and the first steps'
// losses are bitwise those of the all-RAM load.
TEST(EverythingOnNvmeTest, AHuggingFaceModelLoadsEntryByEntryWithEverythingOnNvme) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_on_nvme_hf_load", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  const std::string fixture = "tests/golden/qwen2_tiny";
  absl::StatusOr<ModelConfig> config = LoadModelConfig(fixture + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  TrainerOptions ram = BaseOptions();
  ram.seq_len = 8;
  ram.micro_batch_size = 1;
  TrainerOptions nvme = ram;
  nvme.memory.enabled = true;
  nvme.memory.master_on_nvme = true;
  nvme.memory.grad_on_nvme = true;
  nvme.memory.compute_copy_on_nvme = true;
  nvme.memory.nvme_chunk_bytes = kSmallChunk;
  nvme.memory.budgets.ram = size_t{64} << 20;
  nvme.memory.budgets.nvme_dir = dir;
  nvme.memory.budgets.nvme_bytes = size_t{1} << 30;
  std::vector<double> losses[2];
  std::vector<std::vector<float>> tensors[2];
  int t = 0;
  for (const TrainerOptions& o : {ram, nvme}) {
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, *config, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    if (t == 1) {
      const ParameterStore& store = (*trainer)->store();
      for (int e = 0; e < store.num_entries(); ++e) {
        if (e != (*trainer)->layout().embedding_entry()) {
          EXPECT_EQ(store.MasterScratch(e), nullptr);
        }
      }
    }
    ASSERT_TRUE((*trainer)->LoadHfWeights(fixture).ok());
    for (const LayoutEntry& entry : (*trainer)->layout().entries()) {
      for (const TensorSlot& slot : entry.tensors) {
        auto values = (*trainer)->ReadTensor(slot.hf_name);
        ASSERT_TRUE(values.ok()) << values.status();
        tensors[t].push_back(*values);
      }
    }
    const auto batches = MakeTokenBatches(4, 8, static_cast<int>(config->vocab_size), 23);
    for (int step = 0; step < 2; ++step) {
      auto r = (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
      ASSERT_TRUE(r.ok()) << r.status();
      losses[t].push_back(r->loss);
    }
    ++t;
  }
  EXPECT_EQ(tensors[0], tensors[1]);
  ASSERT_EQ(losses[1].size(), 2u);
  EXPECT_EQ(std::memcmp(losses[0].data(), losses[1].data(), 2 * sizeof(double)), 0)
      << losses[0][1] << " vs " << losses[1][1];
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

// Budgets under which the gradients spill to NVMe (RAM cannot hold them all once m and v moved)
// and the RAM left over keeps the embedding's and layers 0-5's (entries 1-6): pageable RAM for
// the master, 5 staging slots of one chunk for each of m, v and the gradients, those 7 entries'
// gradients and half a layer's more. The pinned budget holds neither copy endpoint.
TrainerOptions SomeGradientsInRam(const std::string& dir, size_t chunk_bytes) {
  TrainerOptions o = BaseOptions();
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return o;
  const ParameterStore& store = (*trainer)->store();
  const size_t master = store.total_elements() * sizeof(float);
  size_t kept = 0;
  for (int e = 0; e <= 6; ++e) kept += store.spec(e).elements * sizeof(float);
  const size_t layer = store.spec((*trainer)->layout().layer_entry(6)).elements * sizeof(float);
  EXPECT_GT(layer, chunk_bytes);  // staging is whole chunks
  o.memory.enabled = true;
  o.memory.nvme_chunk_bytes = chunk_bytes;
  o.memory.budgets.pinned_ram = size_t{4} << 20;
  o.memory.budgets.ram = master + 3 * 5 * chunk_bytes + kept + layer / 2;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes = 4 * master;
  return o;
}

TEST(EverythingOnNvmeTest, GradientsPartlyInRamPartlyOnNvmeAreBitwiseIdentical) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("grad_partly_in_ram", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);
  const TrainerOptions partly = SomeGradientsInRam(dir, 2 * kSmallChunk);
  {
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), partly);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const ParameterStore& store = (*trainer)->store();
    const ParameterLayout& layout = (*trainer)->layout();
    ASSERT_NE(store.nvme_gradients(), nullptr);
    EXPECT_FALSE(store.grad_on_nvme(layout.embedding_entry()));
    for (int layer = 0; layer < 6; ++layer) {
      EXPECT_FALSE(store.grad_on_nvme(layout.layer_entry(layer))) << layer;
      EXPECT_NE(store.entry(layout.layer_entry(layer)).grad, nullptr) << layer;
    }
    for (int layer = 6; layer < DeepNarrow().layers; ++layer) {
      EXPECT_TRUE(store.grad_on_nvme(layout.layer_entry(layer))) << layer;
      EXPECT_EQ(store.entry(layout.layer_entry(layer)).grad, nullptr) << layer;
    }
    const std::string& table = (*trainer)->placement_table();
    EXPECT_NE(table.find("of it in RAM: the embedding's and entries 1-6's)"), std::string::npos)
        << table;
  }
  const Outcome tiered = TrainFiveSteps(partly);
  ExpectBitwise(in_ram, tiered);
  EXPECT_LE(tiered.pageable_bytes, partly.memory.budgets.ram);
  // The same budgets with every gradient on NVMe (asked): the same bits again.
  TrainerOptions all_on_nvme = partly;
  all_on_nvme.memory.grad_on_nvme = true;
  ExpectBitwise(tiered, TrainFiveSteps(all_on_nvme));
}

TEST(EverythingOnNvmeTest, ResumeFromACheckpointTakenWithEverythingOnNvmeIsBitwise) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_on_nvme_resume", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  // Resumed with another chunk size: the chunks are a layout of the working
  // files, not of the checkpoint.
  ExpectBitwiseResume(dir, EverythingOnNvme(dir + "/first", kSmallChunk),
                      EverythingOnNvme(dir + "/second", 3 * kSmallChunk));
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

enum class NvmeFile { kGradients, kComputeCopy };

void FaultOn(NvmeFile which, const std::string& name, tiers::IoOp op,
             tiers::InjectedFault fault) {
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

  // Only requests on that file fail: the 3rd of its kind from now on.
  const ParameterStore& store = (*trainer)->store();
  const std::string path = which == NvmeFile::kGradients ? store.nvme_gradients()->path()
                                                         : store.nvme_compute_copy()->path();
  faults.FailNthOfFile(op, path, 3, fault);
  const absl::Status failure = StepUntilFailure(**trainer);
  ASSERT_FALSE(failure.ok()) << "a fault on " << path << " must fail the step";
  const std::string message(failure.message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(OffsetIn(message), UINT64_MAX) << message;

  auto fresh_device = MakeCpuDevice(size_t{32} << 20);
  auto fresh = Trainer::Create(*fresh_device, TinyConfig(DeepNarrow()), BaseOptions());
  ASSERT_TRUE(fresh.ok());
  auto loaded = LoadCheckpoint(*checkpoint, **fresh);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*fresh)->steps_done(), 1u);
}

// The optimizer pass runs after its Step returned. A read fault on the gradients there stops it
// with the store partly updated (the master in RAM, m and v on NVMe, both left sound) while its
// progress counts the update: no checkpoint may be written from it, and the last one stays the
// newest. One micro-batch a step, so gradients.bin is read only by the pass.
TEST(EverythingOnNvmeTest, AFailedOptimizerPassIsNeverCheckpointed) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("failed_pass_checkpoint", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto uring = tiers::UringBlockIo::Create();
  ASSERT_TRUE(uring.ok()) << uring.status();
  tiers::FaultInjectingBlockIo faults(**uring);
  TrainerOptions o = TieredOptions(1);
  o.memory.grad_on_nvme = true;  // m and v come along; the master stays in RAM
  o.memory.nvme_chunk_bytes = kSmallChunk;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes *= 2;
  o.memory.block_io_for_tests = &faults;
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_NE((*trainer)->store().nvme_gradients(), nullptr);
  (*trainer)->InitializeRandom(3);
  ASSERT_TRUE((*trainer)->Step(batches.InputPointers(0, 1), batches.TargetPointers(0, 1)).ok());
  const std::string root = dir + "/checkpoints";
  auto first = WriteCheckpoint(**trainer, root, CheckpointRunInfo{});
  ASSERT_TRUE(first.ok()) << first.status();

  const std::string gradients = (*trainer)->store().nvme_gradients()->path();
  faults.FailNthOfFile(tiers::IoOp::kRead, gradients, 1, tiers::InjectedFault::kEio);
  // Whether this Step already sees the pass fail or not, nothing of it may be checkpointed.
  (void)(*trainer)->Step(batches.InputPointers(1, 1), batches.TargetPointers(1, 1));
  auto second = WriteCheckpoint(**trainer, root, CheckpointRunInfo{});
  ASSERT_FALSE(second.ok()) << "checkpointed a store its failed update left half-written";
  const std::string message(second.status().message());
  EXPECT_NE(message.find("not checkpointed"), std::string::npos) << message;
  EXPECT_NE(message.find(gradients), std::string::npos) << message;
  EXPECT_EQ(**LatestCheckpoint(root), *first);
}

TEST(EverythingOnNvmeTest, AWriteFaultOnTheGradientsFailsTheStepNamingFileAndOffset) {
  FaultOn(NvmeFile::kGradients, "grad_write_fault", tiers::IoOp::kWrite,
          tiers::InjectedFault::kEnospc);
}

TEST(EverythingOnNvmeTest, AReadFaultOnTheGradientsFailsTheStepNamingFileAndOffset) {
  FaultOn(NvmeFile::kGradients, "grad_read_fault", tiers::IoOp::kRead,
          tiers::InjectedFault::kEio);
}

TEST(EverythingOnNvmeTest, AReadFaultOnTheComputeCopyFailsTheStepNamingFileAndOffset) {
  FaultOn(NvmeFile::kComputeCopy, "copy_read_fault", tiers::IoOp::kRead,
          tiers::InjectedFault::kEio);
}

TEST(EverythingOnNvmeTest, AWriteFaultOnTheComputeCopyFailsTheStepNamingFileAndOffset) {
  FaultOn(NvmeFile::kComputeCopy, "copy_write_fault", tiers::IoOp::kWrite,
          tiers::InjectedFault::kEnospc);
}

}  // namespace
}  // namespace megatrain::engine
