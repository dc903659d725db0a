// Budgets are real with every per-parameter array the placement can move on
// NVMe: a model whose parameter store is more than three times the host
// budget trains with m, v and the gradients on NVMe in small chunks, and the
// process's peak resident memory grows by at most the budgets plus the device
// arena plus the fixed overhead of docs/operations.md. Its own process
// (VmHWM is global).
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

TEST(EverythingOnNvmePeakMemoryTest, AStoreThreeTimesTheHostBudgetTrainsWithinIt) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("everything_peak", &usable);
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
  o.memory.grad_on_nvme = true;
  o.memory.nvme_chunk_bytes = size_t{256} << 10;
  // Pinned: the master (the CPU device's copy source); pageable: the
  // embedding's gradient and 5 slots of three 256 KiB chunks (m, v, gradient).
  o.memory.budgets.pinned_ram = params * 4 + (size_t{1} << 20);
  o.memory.budgets.ram = size_t{5} << 20;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes = params * 16;
  const size_t arena = size_t{24} << 20;
  auto device = MakeCpuDevice(arena);
  const auto batches = MakeTokenBatches(6, 64, shape.vocab, 1);

  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const size_t baseline = ProcStatusBytes("VmRSS");
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->store().grad_on_nvme((*trainer)->layout().layer_entry(0)));
  ASSERT_NE((*trainer)->store().state_store(), nullptr);
  (*trainer)->InitializeRandom(1);
  for (int step = 0; step < 3; ++step) {
    // Two micro-batches: the second adds to the gradients read back from NVMe.
    auto r =
        (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->nvme_bytes_written, 0u);
  }
  ASSERT_TRUE((*trainer)->UpdateStatus().ok());
  const size_t peak = ProcStatusBytes("VmHWM");
  const size_t host_budget = o.memory.budgets.pinned_ram + o.memory.budgets.ram;
  const size_t growth = peak - baseline;
  printf("parameters %zu, store %zu bytes (16 B/param), host budget %zu, peak growth %zu, "
         "budgets + arena %zu\n",
         params, params * 16, host_budget, growth, host_budget + arena);
  EXPECT_LE(growth, host_budget + arena + kFixedOverheadBytes);
  EXPECT_GE(params * 16, 3 * host_budget);  // the store is >= 3x what the host may hold
}

}  // namespace
}  // namespace megatrain::engine
