// Several CPU devices in one process (docs/scale_out.md "Several devices in one
// process"): N devices with accumulation A (a multiple of N) give bitwise the
// losses, gradient norms, gradients, masters and AdamW moments of one device
// with accumulation A -- whole-stage slots, the fragmented ring, a tied
// embedding, links of different speeds. A failed micro-batch fails the step
// without leaving a device waiting; the NVMe compute copy is refused
// (NVMe gradients: tests/tiers/multi_device_tiers_test.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/bitwise_compare.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr int kSteps = 3;
constexpr int kMicroBatch = 2;
constexpr int kSeq = 16;

struct RunConfig {
  std::string name;
  int devices = 1;
  int accumulation = 1;
  bool tied = false;
  size_t weight_ring_bytes = 0;         // > 0: fragment mode
  bool throttle_later_devices = false;  // devices 1.. behind slower links than device 0
};

struct RunResult {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> masters, grads, m, v;
  std::vector<StepReport> reports;
};

TinyShape Shape(bool tied) {
  TinyShape s;
  s.layers = 3;
  s.tied = tied;
  return s;
}

TrainerOptions Options(const RunConfig& rc) {
  TrainerOptions o;
  o.micro_batch_size = kMicroBatch;
  o.seq_len = kSeq;
  o.head_chunk = 16;
  o.head_block_rows = 11;  // several vocabulary blocks: the fragmented head copies out by block
  o.lr.peak_lr = 3e-3;
  o.lr.warmup_steps = 1;
  o.lr.total_steps = kSteps;
  o.grad_clip = 0.5;
  o.executor.checkpoint_interval = 2;
  o.executor.weight_slots = rc.weight_ring_bytes > 0 ? 0 : 2;
  o.executor.weight_ring_bytes = rc.weight_ring_bytes;
  o.executor.fragment_bytes = rc.weight_ring_bytes > 0 ? 1000 : 0;
  return o;
}

RunResult Train(const RunConfig& rc) {
  RunResult result;
  std::vector<std::unique_ptr<CpuDevice>> owned;
  std::vector<Device*> devices;
  for (int d = 0; d < rc.devices; ++d) {
    const double gbps = rc.throttle_later_devices && d > 0 ? 0.5 * d : 0;
    owned.push_back(MakeCpuDevice(size_t{64} << 20, gbps, gbps > 0 ? 20 : 0));
    devices.push_back(owned.back().get());
  }
  const TinyShape shape = Shape(rc.tied);
  auto trainer = Trainer::Create(devices, TinyConfig(shape), Options(rc));
  EXPECT_TRUE(trainer.ok()) << rc.name << ": " << trainer.status();
  if (!trainer.ok()) return result;
  Trainer& t = **trainer;
  EXPECT_EQ(t.device_count(), rc.devices);
  EXPECT_EQ(t.executor().fragment_mode(), rc.weight_ring_bytes > 0) << rc.name;
  t.InitializeRandom(11);
  const int a = rc.accumulation;
  const auto batches = MakeTokenBatches(a * kSteps, kMicroBatch * kSeq, shape.vocab, 41);
  for (int step = 0; step < kSteps; ++step) {
    auto report = t.Step(batches.InputPointers(a * step, a), batches.TargetPointers(a * step, a));
    EXPECT_TRUE(report.ok()) << rc.name << ": " << report.status();
    if (!report.ok()) return result;
    result.losses.push_back(report->loss);
    result.norms.push_back(report->grad_norm);
    result.reports.push_back(*report);
  }
  // Every device's copy-outs took their turns as kWait spans of the label the step's
  // turn_wait_seconds sums (DeviceFiguresFromSpans); one device takes none.
  for (int d = 0; d < rc.devices; ++d) {
    int turn_waits = 0;
    for (const TimelineSpan& span : devices[d]->timeline().Spans()) {
      if (span.kind == SpanKind::kWait && span.label == kGradientTurnWaitLabel) ++turn_waits;
    }
    if (rc.devices > 1) {
      EXPECT_GT(turn_waits, 0) << rc.name << " device " << d;
    } else {
      EXPECT_EQ(turn_waits, 0) << rc.name;
    }
  }
  t.WaitForUpdates();
  const ParameterStore& store = t.store();
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    const size_t n = store.spec(e).elements;
    result.masters.emplace_back(b.master, b.master + n);
    result.grads.emplace_back(b.grad, b.grad + n);
    result.m.emplace_back(b.m, b.m + n);
    result.v.emplace_back(b.v, b.v + n);
  }
  return result;
}

void ExpectBitwiseEqual(const RunResult& a, const RunResult& b, const std::string& name) {
  ASSERT_EQ(a.losses.size(), static_cast<size_t>(kSteps)) << name;
  testing::ExpectSameLosses(a.losses, b.losses, name + " losses");
  testing::ExpectSameLosses(a.norms, b.norms, name + " gradient norms");
  testing::ExpectSameArrays(a.grads, b.grads, name + " gradients");
  testing::ExpectSameArrays(a.masters, b.masters, name + " masters");
  testing::ExpectSameArrays(a.m, b.m, name + " m");
  testing::ExpectSameArrays(a.v, b.v, name + " v");
}

void ExpectSameAsOneDevice(RunConfig rc) {
  RunConfig one = rc;
  one.devices = 1;
  one.throttle_later_devices = false;
  const RunResult reference = Train(one);
  const RunResult several = Train(rc);
  ExpectBitwiseEqual(several, reference, rc.name);
  // The step reports one figure per device: its micro-batches and its link traffic.
  for (const StepReport& report : several.reports) {
    ASSERT_EQ(report.devices.size(), static_cast<size_t>(rc.devices)) << rc.name;
    for (int d = 0; d < rc.devices; ++d) {
      EXPECT_EQ(report.devices[d].micro_batches, rc.accumulation / rc.devices) << rc.name;
      EXPECT_GT(report.devices[d].link_bytes, 0u) << rc.name << " device " << d;
      EXPECT_GT(report.devices[d].compute_seconds, 0.0) << rc.name << " device " << d;
    }
  }
}

TEST(MultiDeviceTest, TwoDevicesEqualOneWithAccumulationTwo) {
  ExpectSameAsOneDevice({.name = "2 devices, A=2", .devices = 2, .accumulation = 2});
}

TEST(MultiDeviceTest, TwoDevicesWithTwoMicroBatchesEach) {
  ExpectSameAsOneDevice({.name = "2 devices, A=4, slow links",
                         .devices = 2,
                         .accumulation = 4,
                         .throttle_later_devices = true});
}

TEST(MultiDeviceTest, ThreeDevicesEqualOneWithAccumulationThreeAndSix) {
  ExpectSameAsOneDevice({.name = "3 devices, A=3", .devices = 3, .accumulation = 3});
  ExpectSameAsOneDevice({.name = "3 devices, A=6, slow links",
                         .devices = 3,
                         .accumulation = 6,
                         .throttle_later_devices = true});
}

TEST(MultiDeviceTest, TiedEmbeddingTakesTwoTurnsPerMicroBatch) {
  ExpectSameAsOneDevice(
      {.name = "tied, 2 devices, A=4", .devices = 2, .accumulation = 4, .tied = true});
  ExpectSameAsOneDevice({.name = "tied, 3 devices, A=3, slow links",
                         .devices = 3,
                         .accumulation = 3,
                         .tied = true,
                         .throttle_later_devices = true});
}

TEST(MultiDeviceTest, FragmentedHeadTakesOneTurnForAllItsBlocks) {
  // A ring of a little over one layer: every op streams as fragments, the head in blocks.
  ExpectSameAsOneDevice({.name = "ring, 2 devices, A=2",
                         .devices = 2,
                         .accumulation = 2,
                         .weight_ring_bytes = 96 * 1024});
  ExpectSameAsOneDevice({.name = "ring, tied, 3 devices, A=3",
                         .devices = 3,
                         .accumulation = 3,
                         .tied = true,
                         .weight_ring_bytes = 96 * 1024,
                         .throttle_later_devices = true});
}

TEST(MultiDeviceTest, FailedMicroBatchFailsTheStepAndTheNextStepRuns) {
  auto d0 = MakeCpuDevice(size_t{64} << 20);
  auto d1 = MakeCpuDevice(size_t{64} << 20);
  const TinyShape shape = Shape(false);
  RunConfig rc{.name = "failing", .devices = 2, .accumulation = 4};
  auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(shape), Options(rc));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  auto batches = MakeTokenBatches(4, kMicroBatch * kSeq, shape.vocab, 5);
  batches.inputs[2][7] = shape.vocab + 4;  // micro-batch 2 (device 0) is refused
  auto failed = (*trainer)->Step(batches.InputPointers(0, 4), batches.TargetPointers(0, 4));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("micro-batch 2 on device 0"), std::string::npos)
      << failed.status();
  EXPECT_NE(failed.status().message().find("outside the vocabulary"), std::string::npos)
      << failed.status();
  batches.inputs[2][7] = 1;
  auto next = (*trainer)->Step(batches.InputPointers(0, 4), batches.TargetPointers(0, 4));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->devices.size(), 2u);
}

TEST(MultiDeviceTest, ComputeCopyOnNvmeIsRefusedNamingTheField) {
  auto d0 = MakeCpuDevice(size_t{64} << 20);
  auto d1 = MakeCpuDevice(size_t{64} << 20);
  RunConfig rc{.name = "nvme", .devices = 2, .accumulation = 2};
  TrainerOptions o = Options(rc);
  o.memory.enabled = true;
  o.memory.budgets.nvme_dir = ::testing::TempDir();
  o.memory.budgets.nvme_bytes = uint64_t{1} << 30;
  o.memory.budgets.ram = uint64_t{1} << 30;
  o.memory.budgets.pinned_ram = uint64_t{1} << 30;
  o.memory.master_on_nvme = true;
  o.memory.compute_copy_on_nvme = true;
  auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(false)), o);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find("memory.compute_copy_on_nvme"), std::string::npos)
      << trainer.status();
  EXPECT_NE(trainer.status().message().find("devices=2"), std::string::npos) << trainer.status();
}

TEST(MultiDeviceTest, NoDevicesIsRefused) {
  auto trainer =
      Trainer::Create(std::vector<Device*>{}, TinyConfig(Shape(false)), TrainerOptions{});
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("devices"), std::string::npos) << trainer.status();
}

}  // namespace
}  // namespace megatrain::engine
