// End-to-end of the NVMe tier for the optimizer: a model-sized set of entries whose AdamW state
// is more than 4x the RAM budget given to it is planned onto NVMe and trained for 5 steps with
// HostAdamw through NvmeStateStore; masters, m and v are bitwise identical to the all-RAM run.
#include <cstring>
#include <vector>

#include "engine/common/thread_pool.h"
#include "engine/optimizer/host_adamw.h"
#include "engine/tiers/nvme_state_store.h"
#include "engine/tiers/placement.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "gtest/gtest.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine::tiers {
namespace {

struct Entry {
  std::vector<float> master, m, v, grad;
  std::vector<AdamwSegment> segments;
};

std::vector<Entry> MakeModel(const std::vector<size_t>& sizes) {
  std::vector<Entry> model;
  for (size_t e = 0; e < sizes.size(); ++e) {
    Entry x;
    const size_t n = sizes[e];
    x.master.resize(n);
    for (size_t i = 0; i < n; ++i) x.master[i] = 0.02f * static_cast<float>((i * 37 + e) % 101);
    x.m.assign(n, 0.0f);
    x.v.assign(n, 0.0f);
    x.grad.resize(n);
    // A weight matrix followed by a norm-like tail without weight decay (odd split).
    x.segments = {{0, n - n / 7, true}, {n - n / 7, n / 7, false}};
    model.push_back(std::move(x));
  }
  return model;
}

void FillGradients(int step, std::vector<Entry>& model) {
  for (size_t e = 0; e < model.size(); ++e) {
    std::vector<float>& g = model[e].grad;
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<float>(static_cast<int>((i * 2654435761u + e * 31 + step * 7) % 2001) -
                                1000) *
             1e-3f;
    }
  }
}

TEST(OptimizerStreaming, StateFourTimesTheRamBudgetTrainsBitwiseLikeRam) {
  absl::Status usable;
  const std::string dir = FreshTestDir("optimizer_streaming", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  absl::StatusOr<std::unique_ptr<UringBlockIo>> io = UringBlockIo::Create();
  if (!io.ok()) GTEST_SKIP() << "io_uring unavailable: " << io.status();

  // Embedding, 40 odd-sized layers, head.
  std::vector<size_t> sizes = {20021};
  for (int l = 0; l < 40; ++l) sizes.push_back(10011 + 213 * l);
  sizes.push_back(20023);

  // Budgets: pinned and pageable RAM cover master + grad + staging, with the states far bigger.
  std::vector<EntryBytes> bytes(sizes.size());
  uint64_t state_bytes = 0, master_grad = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    for (BufferKind k : {BufferKind::kMaster, BufferKind::kM, BufferKind::kV, BufferKind::kGrad}) {
      bytes[e][k] = sizes[e] * sizeof(float);
    }
    state_bytes += 2 * sizes[e] * sizeof(float);
    master_grad += 2 * sizes[e] * sizeof(float);
  }
  NvmeStateStoreOptions store_options;
  store_options.dir = dir;
  store_options.read_ahead = 1;
  store_options.max_writes_in_flight = 1;
  const uint64_t ram_budget = state_bytes / 4;
  absl::StatusOr<Placement> plan =
      PlanPlacement(bytes, {master_grad, ram_budget, dir, 4 * state_bytes},
                    {.staging_slots = store_options.staging_slots()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tier(BufferKind::kM), Tier::kNvme) << plan->Table();
  ASSERT_EQ(plan->tier(BufferKind::kV), Tier::kNvme);
  ASSERT_GE(state_bytes, 4 * plan->ram_used) << plan->Table();

  auto store = NvmeStateStore::Create(**io, store_options, sizes);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_LE((*store)->staging_bytes(), ram_budget);

  std::vector<Entry> ram = MakeModel(sizes);
  std::vector<Entry> tiered = MakeModel(sizes);
  for (Entry& e : tiered) {  // the tiered run keeps no m, v in RAM
    e.m = {};
    e.v = {};
  }
  ThreadPool pool(2);
  HostAdamw adamw(&pool);
  for (int step = 1; step <= 5; ++step) {
    FillGradients(step, ram);
    FillGradients(step, tiered);
    const auto decay = kernels::MakeAdamwStepScalars(1e-3, 0.9, 0.95, 1e-8, 0.1, step, 0.75);
    const auto no_decay = kernels::MakeAdamwStepScalars(1e-3, 0.9, 0.95, 1e-8, 0.0, step, 0.75);
    for (size_t e = 0; e < sizes.size(); ++e) {
      Entry& r = ram[e];
      adamw.Step(decay, no_decay, r.segments, r.master.data(), r.m.data(), r.v.data(),
                 r.grad.data(), nullptr);
      absl::StatusOr<StagedEntry> s = (*store)->Acquire(static_cast<int>(e));
      ASSERT_TRUE(s.ok()) << s.status();
      Entry& t = tiered[e];
      adamw.Step(decay, no_decay, t.segments, t.master.data(), s->array(0), s->array(1),
                 t.grad.data(), nullptr);
      ASSERT_TRUE((*store)->Release(static_cast<int>(e)).ok());
    }
    for (size_t e = 0; e < sizes.size(); ++e) {
      ASSERT_EQ(std::memcmp(ram[e].master.data(), tiered[e].master.data(), sizes[e] * 4), 0)
          << "step " << step << " entry " << e;
    }
  }
  ASSERT_TRUE((*store)->Flush().ok());
  for (size_t e = 0; e < sizes.size(); ++e) {
    absl::StatusOr<StagedEntry> s = (*store)->Acquire(static_cast<int>(e));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(std::memcmp(ram[e].m.data(), s->array(0), sizes[e] * 4), 0) << "m " << e;
    EXPECT_EQ(std::memcmp(ram[e].v.data(), s->array(1), sizes[e] * 4), 0) << "v " << e;
    ASSERT_TRUE((*store)->Release(static_cast<int>(e), false).ok());
  }
}

}  // namespace
}  // namespace megatrain::engine::tiers
