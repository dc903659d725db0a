// Budgets are real: streaming 256 MiB of optimizer state through NvmeStateStore raises the
// process's peak resident memory (VmHWM, reset through /proc/self/clear_refs) by no more than
// the store's staging bytes plus kFixedOverheadBytes (docs/operations.md).
#include <fstream>
#include <string>
#include <vector>

#include "engine/tiers/nvme_state_store.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

// Rings, thread stacks touched, allocator slack and bookkeeping.
constexpr uint64_t kFixedOverheadBytes = 8u << 20;

uint64_t StatusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

TEST(PeakMemory, StreamingStaysWithinStagingPlusFixedOverhead) {
  absl::Status usable;
  const std::string dir = FreshTestDir("peak_memory", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";
    if (!reset.good()) GTEST_SKIP() << "cannot reset VmHWM through /proc/self/clear_refs";
  }
  const uint64_t baseline_kib = StatusKiB("VmHWM");
  ASSERT_GT(baseline_kib, 0u);

  auto io = UringBlockIo::Create();
  ASSERT_TRUE(io.ok()) << io.status();
  NvmeStateStoreOptions o;
  o.dir = dir;
  std::vector<size_t> sizes(64, (1u << 20) - 3);  // 64 entries x 2 arrays x ~4 MiB = 512 MiB
  auto store = NvmeStateStore::Create(**io, o, sizes);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_GE((*store)->file_bytes(), 8 * (*store)->staging_bytes());
  for (int pass = 0; pass < 2; ++pass) {
    for (int e = 0; e < (*store)->num_entries(); ++e) {
      auto s = (*store)->Acquire(e);
      ASSERT_TRUE(s.ok()) << s.status();
      for (size_t i = 0; i < sizes[e]; ++i) s->array(0)[i] += 1.0f, s->array(1)[i] += 2.0f;
      ASSERT_TRUE((*store)->Release(e).ok());
    }
  }
  ASSERT_TRUE((*store)->Flush().ok());
  const uint64_t growth = (StatusKiB("VmHWM") - baseline_kib) * 1024;
  const uint64_t budget = (*store)->staging_bytes() + kFixedOverheadBytes;
  EXPECT_LE(growth, budget) << "VmHWM grew " << growth << " B; staging "
                            << (*store)->staging_bytes() << " B";
  RecordProperty("vmhwm_growth_bytes", std::to_string(growth));
  RecordProperty("staging_bytes", std::to_string((*store)->staging_bytes()));
}

}  // namespace
}  // namespace megatrain::engine::tiers
