// Tests of the planner's NVMe traffic: exact bytes per step for hand-computed Qwen2.5-1.5B
// placements (CPU device and GPU), the step-time model's NVMe time from those bytes, and the
// printed lines.
#include "engine/planner/nvme_traffic.h"

#include <gtest/gtest.h>

#include "engine/planner/model_presets.h"
#include "engine/planner/planner.h"

namespace megatrain::engine::planner {
namespace {

using tiers::BufferKind;
using tiers::Tier;

// Qwen2.5-1.5B (tied): 1,543,714,304 parameters -> 6,174,857,216 fp32 bytes per array; the
// embedding (151936 x 1536) 233,373,696 parameters -> 933,494,784 bytes of gradient stay in RAM.
constexpr uint64_t kArray = 6174857216;
constexpr uint64_t kEmbeddingGrad = 933494784;
constexpr uint64_t kGradOnNvme = kArray - kEmbeddingGrad;  // 5,241,362,432 (grad_on_nvme asked)
// Under 10 GiB of RAM the gradients move to NVMe because RAM overflows, and the RAM left over
// keeps whole entries' gradients in forward order. By hand: a layer is 1536*1536*2 (q, o) +
// 1536*256*2 (k, v) + 1536 + 2*256 (biases) + 3*1536*8960 (MLP) + 2*1536 (norms) = 46,797,824
// parameters = 187,191,296 bytes. RAM holds the master 6,174,857,216 + the embedding's gradient
// 933,494,784 + staging 5 slots x 3 kinds (m, v, grad) x 64 MiB = 1,006,632,960, i.e.
// 8,114,984,960 of 10,737,418,240: 2,622,433,280 left hold 14 layers (2,620,678,144; 15 would
// be 2,807,869,440): entries 1-14. On NVMe: entries 15-28 (layers 14-27) and the final norm
// (1536*4 bytes).
constexpr uint64_t kLayerGrad = 187191296;
constexpr uint64_t kGradOnNvmeUnderTenGib = 14 * kLayerGrad + 1536 * 4;  // 2,620,684,288
static_assert(kGradOnNvme == 28 * kLayerGrad + 1536 * 4, "the layer's size by hand");

// The CPU device with fixed speeds (no probe: nothing here depends on the machine).
HardwareProfile CpuDevice() {
  HardwareProfile hw;
  hw.name = "cpu-test";
  hw.cpu_device = true;
  hw.device_memory_bytes = uint64_t{3584} << 20;
  hw.dense_tflops = 0.05;
  hw.compute_efficiency = 1;
  hw.device_memory_gbps = 5;
  hw.memcpy_gbps = 5;
  hw.host_memory_gbps = 10;
  hw.adamw_params_per_second = 2e8;
  hw.nvme_read_gbps = 2;
  hw.nvme_write_gbps = 2.5;
  hw.weight_bytes = 4;
  hw.activation_bytes = 4;
  return hw;
}

// The measured run of docs/benchmarks.md §9: 10 GiB of RAM, no pinned budget, 60 GiB of NVMe.
PlanInputs TenGibBudget() {
  PlanInputs in;
  in.seq = 256;
  in.micro_batch = 1;
  in.budgets_enabled = true;
  in.budgets.pinned_ram = 0;
  in.budgets.ram = uint64_t{10} << 30;
  in.budgets.nvme_dir = "/nvme";
  in.budgets.nvme_bytes = uint64_t{60} << 30;
  return in;
}

TEST(NvmeTrafficTest, QwenOnePointFiveBOnTheCpuDeviceUnderTenGib) {
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset("qwen2.5-1.5b"), TenGibBudget(), CpuDevice());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->parameters, 1543714304);
  // The placement of the measured run: m, v and the gradients (but the embedding's and
  // entries 1-14's) on NVMe.
  EXPECT_EQ(p->placement.tier(BufferKind::kMaster), Tier::kRam);
  EXPECT_EQ(p->placement.tier(BufferKind::kM), Tier::kNvme);
  EXPECT_EQ(p->placement.tier(BufferKind::kGrad), Tier::kNvme);
  EXPECT_EQ(p->placement.grad_kept_entries.size(), 14u);
  EXPECT_EQ(p->placement.ram_used, 6174857216u + kEmbeddingGrad + 1006632960u + 14 * kLayerGrad);
  const NvmeTraffic& t = p->nvme_traffic;
  // Measured with the embedding's gradient alone in RAM (docs/benchmarks.md §9): 17.59 GB
  // written per step; now 2 x 6.17 GB + 2.62 GB.
  EXPECT_EQ(t.written_bytes, 2 * kArray + kGradOnNvmeUnderTenGib);
  EXPECT_EQ(t.written_bytes, 14970398720u);
  EXPECT_EQ(t.read_bytes, 2 * kArray + kGradOnNvmeUnderTenGib);
  EXPECT_EQ(t.backward_written_bytes, kGradOnNvmeUnderTenGib);
  EXPECT_EQ(t.backward_read_bytes, 0u);
  EXPECT_EQ(t.optimizer_read_bytes, 2 * kArray + kGradOnNvmeUnderTenGib);
  EXPECT_EQ(t.optimizer_written_bytes, 2 * kArray);
  EXPECT_EQ(t.read[static_cast<int>(BufferKind::kMaster)], 0u);
  EXPECT_EQ(t.written[static_cast<int>(BufferKind::kGrad)], kGradOnNvmeUnderTenGib);

  // Four micro-batches: the gradients are written four times and read back three times (plus
  // once by the optimizer); m and v still once each way.
  PlanInputs in = TenGibBudget();
  in.grad_accumulation = 4;
  absl::StatusOr<PlanResult> q = Plan(*ModelPreset("qwen2.5-1.5b"), in, CpuDevice());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->nvme_traffic.written_bytes, 2 * kArray + 4 * kGradOnNvmeUnderTenGib);
  EXPECT_EQ(q->nvme_traffic.read_bytes, 2 * kArray + 4 * kGradOnNvmeUnderTenGib);
  EXPECT_EQ(q->nvme_traffic.backward_read_bytes, 3 * kGradOnNvmeUnderTenGib);
  EXPECT_EQ(q->nvme_traffic.backward_written_bytes, 4 * kGradOnNvmeUnderTenGib);

  // Asked for (grad_on_nvme), every gradient but the embedding's goes, RAM left over or not.
  in = TenGibBudget();
  in.grad_on_nvme = true;
  absl::StatusOr<PlanResult> asked = Plan(*ModelPreset("qwen2.5-1.5b"), in, CpuDevice());
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->nvme_traffic.written_bytes, 2 * kArray + kGradOnNvme);
  EXPECT_EQ(asked->nvme_traffic.written_bytes, 17591076864u);
}

TEST(NvmeTrafficTest, EverythingMovableOnNvmeOnAGpu) {
  HardwareProfile hw = *FindHardwareProfile(BuiltinHardwareProfiles(), "h100-pcie");
  PlanInputs in = TenGibBudget();
  in.budgets.pinned_ram = uint64_t{4} << 30;
  in.master_on_nvme = true;
  in.grad_on_nvme = true;
  in.grad_accumulation = 3;
  in.gradient_accumulation = GradientAccumulation::kHost;  // every micro-batch's go out
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset("qwen2.5-1.5b"), in, hw);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->placement.tier(BufferKind::kMaster), Tier::kNvme);
  EXPECT_EQ(p->placement.tier(BufferKind::kComputeCopy), Tier::kPinned);
  const NvmeTraffic& t = p->nvme_traffic;
  EXPECT_EQ(t.optimizer_read_bytes, 3 * kArray + kGradOnNvme);
  EXPECT_EQ(t.optimizer_written_bytes, 3 * kArray);
  EXPECT_EQ(t.backward_written_bytes, 3 * kGradOnNvme);
  EXPECT_EQ(t.backward_read_bytes, 2 * kGradOnNvme);
  EXPECT_EQ(t.read_bytes, 3 * kArray + 3 * kGradOnNvme);
  EXPECT_EQ(t.written_bytes, 3 * kArray + 3 * kGradOnNvme);
  // The step-time model moves exactly these bytes at the profile's NVMe speeds.
  EXPECT_NEAR(
      p->time.nvme_seconds,
      t.read_bytes / (hw.nvme_read_gbps * 1e9) + t.written_bytes / (hw.nvme_write_gbps * 1e9),
      1e-9 * p->time.nvme_seconds);
  EXPECT_NEAR(
      p->time.nvme_backward_seconds,
      3 * kGradOnNvme / (hw.nvme_write_gbps * 1e9) + 2 * kGradOnNvme / (hw.nvme_read_gbps * 1e9),
      1e-9 * p->time.nvme_backward_seconds);
}

// Summed on the device (auto on a GPU with several micro-batches), the gradients reach NVMe once
// a step: written by the last micro-batch, never read back before the optimizer.
TEST(NvmeTrafficTest, GradientsSummedOnTheDeviceAreWrittenOnceAStep) {
  HardwareProfile hw = *FindHardwareProfile(BuiltinHardwareProfiles(), "h100-pcie");
  PlanInputs in = TenGibBudget();
  in.budgets.pinned_ram = uint64_t{4} << 30;
  in.master_on_nvme = true;
  in.grad_on_nvme = true;
  in.grad_accumulation = 3;
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset("qwen2.5-1.5b"), in, hw);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->executor.gradient_accumulation, GradientAccumulation::kDevice);
  EXPECT_GT(p->device.gradient_sums, 0u);
  const NvmeTraffic& t = p->nvme_traffic;
  EXPECT_EQ(t.backward_written_bytes, kGradOnNvme);
  EXPECT_EQ(t.backward_read_bytes, 0u);
  EXPECT_EQ(t.optimizer_read_bytes, 3 * kArray + kGradOnNvme);
  EXPECT_NEAR(
      p->time.nvme_seconds,
      t.read_bytes / (hw.nvme_read_gbps * 1e9) + t.written_bytes / (hw.nvme_write_gbps * 1e9),
      1e-9 * p->time.nvme_seconds);
  EXPECT_NEAR(p->time.nvme_backward_seconds, kGradOnNvme / (hw.nvme_write_gbps * 1e9),
              1e-9 * p->time.nvme_backward_seconds);
}

TEST(NvmeTrafficTest, EveryArrayOnNvmeOnTheCpuDeviceReadsTheComputeCopyPerMicroBatch) {
  PlanInputs in = TenGibBudget();
  in.budgets.ram = uint64_t{4} << 30;
  in.compute_copy_on_nvme = true;
  in.grad_accumulation = 2;
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset("qwen2.5-1.5b"), in, CpuDevice());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->placement.tier(BufferKind::kComputeCopy), Tier::kNvme);
  EXPECT_EQ(p->placement.tier(BufferKind::kMaster), Tier::kNvme);
  // The fp32 copy but the embedding's (the same bytes as the gradient on NVMe): written once by
  // the optimizer, read by the weight copies of forward, recompute and backward of both
  // micro-batches that the slot policy makes (a slot still holding a layer reads nothing): at
  // most three reads per micro-batch, at least the first forward's.
  const NvmeTraffic& t = p->nvme_traffic;
  const int copy = static_cast<int>(BufferKind::kComputeCopy);
  EXPECT_EQ(t.written[copy], kGradOnNvme);
  EXPECT_EQ(t.read[copy], t.weights_read_bytes);
  EXPECT_LE(t.weights_read_bytes, 2 * 3 * kGradOnNvme);
  EXPECT_GE(t.weights_read_bytes, kGradOnNvme - kEmbeddingGrad);
  EXPECT_EQ(t.optimizer_written_bytes, 3 * kArray + kGradOnNvme);
  EXPECT_EQ(t.read_bytes, 3 * kArray + kGradOnNvme /* optimizer grad */ +
                              kGradOnNvme /* backward read-back */ + t.weights_read_bytes);
  // The replay reads the compute copy on the weight copies and writes it in the optimizer pass:
  // the step-time model moves exactly the plan's bytes.
  const HardwareProfile hw = CpuDevice();
  EXPECT_NEAR(p->time.nvme_weights_seconds, t.weights_read_bytes / (hw.nvme_read_gbps * 1e9),
              1e-6 * p->time.nvme_weights_seconds);
  EXPECT_NEAR(
      p->time.nvme_seconds,
      t.read_bytes / (hw.nvme_read_gbps * 1e9) + t.written_bytes / (hw.nvme_write_gbps * 1e9),
      1e-6 * p->time.nvme_seconds);
}

TEST(NvmeTrafficTest, NothingOnNvmeMovesNothing) {
  PlanInputs in;
  in.seq = 256;
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset("qwen2.5-0.5b"), in, CpuDevice());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->nvme_traffic.read_bytes, 0u);
  EXPECT_EQ(p->nvme_traffic.written_bytes, 0u);
  EXPECT_EQ(p->time.nvme_seconds, 0);
  EXPECT_EQ(p->Table().find("NVMe read/written per step"), std::string::npos);
}

TEST(NvmeTrafficTest, SlowDiskMakesNvmeTheBottleneckAndThePlanSaysPerDay) {
  HardwareProfile hw = *FindHardwareProfile(BuiltinHardwareProfiles(), "h100-pcie");
  PlanInputs in = TenGibBudget();
  in.budgets.pinned_ram = uint64_t{4} << 30;
  in.master_on_nvme = true;
  in.grad_on_nvme = true;
  absl::StatusOr<PlanResult> fast = Plan(*ModelPreset("qwen2.5-1.5b"), in, hw);
  ASSERT_TRUE(fast.ok()) << fast.status();
  hw.nvme_read_gbps = 0.5;
  hw.nvme_write_gbps = 0.5;
  absl::StatusOr<PlanResult> slow = Plan(*ModelPreset("qwen2.5-1.5b"), in, hw);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->time.bottleneck, "nvme");
  // Overlapped, never less than the disk's busy time, never more than disk + compute.
  EXPECT_GE(slow->time.step_seconds, slow->time.nvme_seconds);
  EXPECT_GT(slow->time.step_seconds, fast->time.step_seconds);
  EXPECT_NEAR(slow->drive_wear.written_per_day,
              slow->nvme_traffic.written_bytes * 86400.0 / slow->time.step_seconds, 1);
  const std::string table = slow->Table();
  EXPECT_NE(table.find("NVMe read/written per step"), std::string::npos) << table;
  EXPECT_NE(table.find("NVMe written per day"), std::string::npos) << table;
  EXPECT_NE(slow->ToJson().find("\"written_bytes_per_day\""), std::string::npos);
}

TEST(NvmeTrafficTest, WearWarningInThePlan) {
  HardwareProfile hw = CpuDevice();
  PlanInputs in = TenGibBudget();
  in.steps = 1000;  // 1000 x 14.97 GB = 15.0 TB
  in.drive_wear.rated_tbw_bytes = uint64_t{600} * 1000 * 1000 * 1000 * 1000;  // 600 TB
  in.drive_wear.warn_share = 0.05;                                            // 30 TB
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset("qwen2.5-1.5b"), in, hw);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->drive_wear.written_per_run, 1000 * p->nvme_traffic.written_bytes);
  EXPECT_TRUE(p->drive_wear.warning.empty()) << p->drive_wear.warning;
  in.steps = 3000;  // 44.9 TB > 30 TB
  p = Plan(*ModelPreset("qwen2.5-1.5b"), in, hw);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE(p->drive_wear.warning.find("WARNING drive wear"), std::string::npos);
  EXPECT_NE(p->Table().find("WARNING drive wear"), std::string::npos);
  in.drive_wear.warn_share = 1.5;
  EXPECT_NE(Plan(*ModelPreset("qwen2.5-1.5b"), in, hw)
                .status()
                .message()
                .find("nvme_wear_warn_share=1.5"),
            std::string::npos);
}

}  // namespace
}  // namespace megatrain::engine::planner
