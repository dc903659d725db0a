// Budgets are real with every per-parameter array on NVMe: a model whose
// parameter store is far larger than the host budget (first with m, v and the
// gradients on NVMe, then with some layers' gradients kept in the RAM left
// over, then with the master and the compute copy too) trains in
// small chunks, and the process's peak resident memory grows by at most the
// budgets plus the device arena plus the fixed overhead of
// docs/operations.md. Its own process (VmHWM is global; each test resets it).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/common/proc_status.h"
#include "engine/tiers/test_dir.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr size_t kFixedOverheadBytes = size_t{48} << 20;

struct PeakRun {
  size_t params = 0;
  size_t host_budget = 0;
  size_t arena = 0;
  size_t growth = 0;
  int layers_with_gradient_in_ram = 0;
};

// Trains 3 steps of 2 micro-batches of a 23M-parameter model with the given
// memory options (nvme_dir filled in) and returns the VmHWM growth.
PeakRun TrainAndMeasure(const std::string& dir, HostMemoryBudgets memory) {
  TinyShape shape;
  shape.layers = 32;
  shape.hidden = 256;
  shape.ffn = 688;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.vocab = 97;
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 32;
  o.lr.total_steps = 3;
  o.executor.weight_slots = 2;
  o.executor.device_checkpoints = 0;
  PeakRun run;
  run.params = 32 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 688 + 2 * 256) + 2 * 97 * 256;
  memory.enabled = true;
  memory.nvme_chunk_bytes = size_t{256} << 10;
  memory.budgets.nvme_dir = dir;
  memory.budgets.nvme_bytes = run.params * 24;
  o.memory = memory;
  run.arena = size_t{24} << 20;
  run.host_budget = memory.budgets.pinned_ram + memory.budgets.ram;
  auto device = MakeCpuDevice(run.arena);
  const auto batches = MakeTokenBatches(6, 64, shape.vocab, 1);

  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const size_t baseline = ProcStatusBytes("VmRSS");
  {
    auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return run;
    EXPECT_NE((*trainer)->store().nvme_gradients(), nullptr);
    for (int layer = 0; layer < shape.layers; ++layer) {
      run.layers_with_gradient_in_ram +=
          (*trainer)->store().grad_on_nvme((*trainer)->layout().layer_entry(layer)) ? 0 : 1;
    }
    EXPECT_NE((*trainer)->store().state_store(), nullptr);
    (*trainer)->InitializeRandom(1);
    for (int step = 0; step < 3; ++step) {
      // Two micro-batches: the second adds to the gradients read back from NVMe.
      auto r = (*trainer)->Step(batches.InputPointers(2 * step, 2),
                                batches.TargetPointers(2 * step, 2));
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return run;
      EXPECT_GT(r->nvme_bytes_written, 0u);
    }
    EXPECT_TRUE((*trainer)->UpdateStatus().ok());
  }
  run.growth = ProcStatusBytes("VmHWM") - baseline;
  printf("parameters %zu, store %zu bytes (16 B/param), host budget %zu, peak growth %zu, "
         "budgets + arena %zu\n",
         run.params, run.params * 16, run.host_budget, run.growth, run.host_budget + run.arena);
  return run;
}

TEST(EverythingOnNvmePeakMemoryTest, GradientsAndStatesOnNvmeStayWithinTheBudgets) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("grad_peak", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  HostMemoryBudgets memory;
  memory.grad_on_nvme = true;
  // Pinned: the master (the CPU device's copy source) beside the executor's pinned staging,
  // which the placement sets aside first (the host checkpoints and gradient staging: about
  // 3.4 MB); pageable: the embedding's gradient and 5 slots of three 256 KiB chunks (m, v,
  // gradient).
  const size_t params = 32 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 688 + 2 * 256) +
                        2 * 97 * 256;
  memory.budgets.pinned_ram = params * 4 + (size_t{8} << 20);
  memory.budgets.ram = size_t{5} << 20;
  const PeakRun run = TrainAndMeasure(dir, memory);
  EXPECT_LE(run.growth, run.host_budget + run.arena + kFixedOverheadBytes);
  EXPECT_GE(run.params * 16, 3 * run.host_budget);  // the store is >= 3x what the host may hold
  EXPECT_EQ(run.layers_with_gradient_in_ram, 0);      // asked: every layer's on NVMe
}

TEST(EverythingOnNvmePeakMemoryTest, GradientsPartlyKeptInRamStayWithinTheBudgets) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("grad_partly_peak", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  HostMemoryBudgets memory;
  // Not asked: the gradients spill because RAM overflows, and the 16 MiB of pageable RAM keep,
  // beside 5 slots of three 256 KiB chunks and the embedding's gradient, the gradients of the
  // first layers (about 2.9 MB each: 4 of them), in pageable RAM.
  const size_t params = 32 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 688 + 2 * 256) +
                        2 * 97 * 256;
  // Pinned: the master beside the executor's pinned staging (about 3.4 MB, set aside first).
  memory.budgets.pinned_ram = params * 4 + (size_t{8} << 20);
  memory.budgets.ram = size_t{16} << 20;
  const PeakRun run = TrainAndMeasure(dir, memory);
  EXPECT_LE(run.growth, run.host_budget + run.arena + kFixedOverheadBytes);
  EXPECT_GT(run.layers_with_gradient_in_ram, 0);
  EXPECT_LT(run.layers_with_gradient_in_ram, 32);
}

TEST(EverythingOnNvmePeakMemoryTest, EveryArrayOnNvmeNeedsOnlyStagingOfRam) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_peak", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  HostMemoryBudgets memory;
  memory.grad_on_nvme = true;
  memory.master_on_nvme = true;
  memory.compute_copy_on_nvme = true;
  // RAM: the embedding's copy and gradient (97 x 256 floats each) and 5 slots
  // of five 256 KiB chunks (m, v, master, gradient, compute copy).
  memory.budgets.pinned_ram = 0;
  memory.budgets.ram = size_t{8} << 20;
  const PeakRun run = TrainAndMeasure(dir, memory);
  EXPECT_LE(run.growth, run.host_budget + run.arena + kFixedOverheadBytes);
  EXPECT_GE(run.params * 16, 40 * run.host_budget);  // the store is >= 40x the host budget
}

}  // namespace
}  // namespace megatrain::engine
