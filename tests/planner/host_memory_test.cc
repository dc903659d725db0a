// Predicted vs measured memory of a real training run on the CPU device: the arena peak within
// 1% (the plan is exact) and the process's VmHWM growth within 5%. One case per process (VmHWM
// is process-wide and freed heap is reused), chosen by the first argument (an index into
// StandardCases()).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/planner/local_probe.h"
#include "engine/tiers/test_dir.h"
#include "tests/planner/accuracy_case.h"

namespace megatrain::engine::planner {
namespace {

int g_case = 0;

TEST(HostMemoryTest, PredictedPeaksMatchTheMeasuredOnes) {
  const AccuracyCase c = StandardCases().at(g_case);
  std::string dir;
  if (c.nvme) {
    absl::Status usable;
    dir = tiers::FreshTestDir("planner_memory", &usable);
    if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  }
  // The profile's speeds do not enter the memory prediction; only its dtypes do.
  HardwareProfile local;
  local.name = "local";
  local.cpu_device = true;
  local.dense_tflops = 0.1;
  local.device_memory_gbps = local.host_memory_gbps = 10;
  local.adamw_params_per_second = 1e8;
  local.nvme_read_gbps = local.nvme_write_gbps = 1;
  local.weight_bytes = local.activation_bytes = local.grad_bytes = 4;
  absl::StatusOr<Measured> m = RunCase(c, /*warmup=*/1, /*steps=*/2, dir);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<PlanResult> p = PredictCase(c, local, dir);
  ASSERT_TRUE(p.ok()) << p.status();
  const double arena = static_cast<double>(p->device_arena_peak);
  const double hwm = static_cast<double>(p->host_peak_bytes);
  printf(
      "%s: arena peak measured %llu predicted %.0f; VmHWM growth measured %llu predicted %.0f "
      "(store %llu + pinned staging %llu + arena %llu + fixed %llu); unexplained %+.2f MB\n",
      c.name.c_str(), static_cast<unsigned long long>(m->arena_peak), arena,
      static_cast<unsigned long long>(m->vmhwm_growth), hwm,
      static_cast<unsigned long long>(p->host_store_bytes),
      static_cast<unsigned long long>(p->host_pinned_staging),
      static_cast<unsigned long long>(p->host_arena_bytes),
      static_cast<unsigned long long>(p->host_fixed_overhead),
      (static_cast<double>(m->vmhwm_growth) -
       static_cast<double>(p->host_peak_bytes - p->host_fixed_overhead)) /
          1e6);
  EXPECT_NEAR(arena, static_cast<double>(m->arena_peak), 0.01 * arena);
  EXPECT_NEAR(hwm, static_cast<double>(m->vmhwm_growth), 0.05 * hwm);
}

}  // namespace
}  // namespace megatrain::engine::planner

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) megatrain::engine::planner::g_case = std::atoi(argv[1]);
  return RUN_ALL_TESTS();
}
