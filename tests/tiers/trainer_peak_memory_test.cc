// Budgets are real: training with m and v on NVMe, the process's peak resident
// memory grows by at most the host budgets (pinned_ram + ram) plus the device
// arena (the CPU device's emulated GPU memory lives in host RAM too) plus the
// fixed overhead documented in docs/operations.md (executor staging, thread
// stacks, allocator slack). Runs alone in its own process (VmHWM is global).
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

TEST(TrainerPeakMemoryTest, PeakResidentMemoryStaysWithinTheBudgets) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("trainer_peak", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
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
  const size_t params =
      32 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 688 + 2 * 256) + 2 * 97 * 256;
  o.memory.enabled = true;
  o.memory.budgets.pinned_ram = params * 8 + (size_t{2} << 20);  // master + gradients
  o.memory.budgets.ram = params * 2;                             // m + v need 8 bytes/param
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes = params * 16;
  const size_t arena = size_t{24} << 20;
  auto device = MakeCpuDevice(arena);
  const auto batches = MakeTokenBatches(3, 64, shape.vocab, 1);

  // Reset the high-water mark to the current resident set.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const size_t baseline = ProcStatusBytes("VmRSS");
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(1);
  for (int step = 0; step < 3; ++step) {
    auto r = (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  ASSERT_TRUE((*trainer)->UpdateStatus().ok());
  const size_t peak = ProcStatusBytes("VmHWM");
  const size_t budget = o.memory.budgets.pinned_ram + o.memory.budgets.ram + arena;
  const size_t growth = peak - baseline;
  printf(
      "parameters %zu, optimizer state %zu bytes on NVMe, peak growth %zu bytes, "
      "budgets + arena %zu bytes\n",
      params, params * 8, growth, budget);
  EXPECT_LE(growth, budget + kFixedOverheadBytes);
  // The state that went to NVMe is more than the RAM budget could ever hold.
  EXPECT_GT(params * 8, o.memory.budgets.ram * 3);
}

}  // namespace
}  // namespace megatrain::engine
