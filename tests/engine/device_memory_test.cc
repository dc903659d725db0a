// Device memory contract: with activation checkpoints on the host and two
// weight slots, the arena peak does not grow with depth (8 vs 32 layers: both
// have host checkpoints, so both have the staging buffer; 4 layers at k = 4
// are one top block with no checkpoint at all), and
// an arena too small for the plan fails up front saying how much it needs, and
// so does a pinned budget too small for the executor's staging (not blamed on
// the device memory).
#include <gtest/gtest.h>

#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

TrainerOptions StreamingOptions() {
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 32;
  o.head_chunk = 32;
  o.lr.total_steps = 2;
  o.executor.checkpoint_interval = 4;
  o.executor.device_checkpoints = 0;  // every checkpoint on the host
  o.executor.weight_slots = 2;
  return o;
}

uint64_t MeasuredPeak(int layers) {
  TinyShape shape;
  shape.layers = layers;
  auto device = MakeCpuDevice(size_t{64} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(shape), StreamingOptions());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return 0;
  (*trainer)->InitializeRandom(1);
  const auto batches = MakeTokenBatches(2, 64, shape.vocab, 5);
  uint64_t peak = 0;
  for (int step = 0; step < 2; ++step) {
    auto report = (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
    EXPECT_TRUE(report.ok()) << report.status();
    if (report.ok()) peak = std::max(peak, report->device_arena_peak_bytes);
  }
  // Everything the executor holds is allocated up front; the step adds nothing.
  EXPECT_EQ(peak, device->arena_stats().in_use);
  EXPECT_EQ(peak, (*trainer)->executor().plan().total());
  return peak;
}

TEST(DeviceMemoryTest, PeakDoesNotDependOnDepth) {
  const uint64_t shallow = MeasuredPeak(8);
  const uint64_t deep = MeasuredPeak(32);
  ASSERT_GT(shallow, 0u);
  EXPECT_LE(static_cast<double>(deep), 1.01 * static_cast<double>(shallow))
      << "8 layers: " << shallow << " bytes, 32 layers: " << deep << " bytes";
  EXPECT_GE(static_cast<double>(deep), 0.99 * static_cast<double>(shallow));
}

TEST(DeviceMemoryTest, TooSmallArenaSaysWhatItNeeds) {
  TinyShape shape;
  shape.layers = 4;
  auto device = MakeCpuDevice(64 << 10);  // 64 KiB: less than two layers' weights
  auto trainer = Trainer::Create(*device, TinyConfig(shape), StreamingOptions());
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(trainer.status().message());
  EXPECT_NE(message.find("needs"), std::string::npos) << message;
  EXPECT_NE(message.find("weight slots"), std::string::npos) << message;
  EXPECT_NE(message.find("capacity 65536"), std::string::npos) << message;
}

TEST(DeviceMemoryTest, TooLittlePinnedMemorySaysSoNotDeviceMemory) {
  TinyShape shape;
  shape.layers = 4;
  DeviceOptions d;
  d.arena_bytes = size_t{64} << 20;
  d.pinned_budget_bytes = 4096;  // less than one host checkpoint
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(d);
  ASSERT_TRUE(device.ok()) << device.status();
  TrainerOptions o = StreamingOptions();
  o.memory.enabled = true;  // the store in pageable RAM: only the executor asks for pinned
  o.memory.budgets.pinned_ram = 0;
  o.memory.budgets.ram = uint64_t{1} << 30;
  auto trainer = Trainer::Create(**device, TinyConfig(shape), o);
  ASSERT_FALSE(trainer.ok());
  const std::string message(trainer.status().message());
  EXPECT_NE(message.find("pinned"), std::string::npos) << message;
  EXPECT_EQ(message.find("device memory too small"), std::string::npos) << message;
}

}  // namespace
}  // namespace megatrain::engine
