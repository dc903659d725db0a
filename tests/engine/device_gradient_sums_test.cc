// Gradient accumulation on the device (ExecutorOptions::gradient_accumulation = kDevice): a
// step's micro-batches summed in fp32 on the device and copied out once give the same bits as
// every micro-batch copied out and added on the host, for losses, gradients and weights over
// several steps; in whole slots and through the fragment ring (the LM head's gradient then comes
// in vocabulary blocks), untied and tied (the tied embedding stays summed on the host), with the
// gradients in RAM or on NVMe, and with layers of several 4 MiB staging chunks (the host sums
// then alternate between two staging buffers while the host pool adds). And the gradients
// really stay on the device until the last micro-batch: fewer bytes leave it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/exec/executor_geometry.h"
#include "engine/tiers/test_dir.h"
#include "tests/engine/bitwise_compare.h"
#include "tests/engine/executor_rig.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr int kMicroBatch = 2;
constexpr int kSeq = 23;
constexpr int kAccumulation = 3;
constexpr int kSteps = 3;

struct Case {
  std::string name;
  bool tied = false;
  double ring_layers = 0;  // > 0: fragment mode through a ring of this many layers
  bool grad_on_nvme = false;
  bool wide_layers = false;  // a layer of 2.3M floats: three staging chunks
};

TinyShape ShapeOf(const Case& c) {
  TinyShape shape;
  shape.layers = 3;
  shape.vocab = 301;
  shape.tied = c.tied;
  if (c.wide_layers) {
    shape.layers = 2;
    shape.hidden = 256;
    shape.heads = 4;
    shape.kv_heads = 2;
    shape.ffn = 2752;
  }
  return shape;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> gradients;  // the last step's, per tensor
  std::vector<std::vector<float>> masters;    // after the last step, per tensor
  size_t gradient_sums = 0;                   // device bytes of the sums
  double link_bytes = 0;                      // layer bytes moved over the link, all steps
  GradientAccumulation resolved = GradientAccumulation::kAuto;
};

Outcome Train(const Case& c, GradientAccumulation accumulation, const std::string& nvme_dir) {
  Outcome out;
  const TinyShape shape = ShapeOf(c);
  const ModelConfig config = TinyConfig(shape);
  TrainerOptions o;
  o.micro_batch_size = kMicroBatch;
  o.seq_len = kSeq;
  o.head_chunk = 16;
  o.head_block_rows = 100;  // the LM head in vocabulary blocks (fragment mode)
  o.lr.peak_lr = 3e-3;
  o.lr.warmup_steps = 1;
  o.lr.total_steps = kSteps;
  o.grad_clip = 0.5;
  o.executor.weight_slots = 2;
  o.executor.gradient_accumulation = accumulation;
  if (c.ring_layers > 0) {
    absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
    EXPECT_TRUE(layout.ok());
    absl::StatusOr<ExecutorGeometry> g =
        MakeExecutorGeometry(config, *layout, kMicroBatch, kSeq, /*head_chunk=*/16);
    EXPECT_TRUE(g.ok());
    o.executor.weight_ring_bytes = static_cast<size_t>(
        c.ring_layers *
        static_cast<double>(StreamingExecutor::LayerRingBytes(g->dims, g->layout.layer_offsets)));
  }
  if (c.grad_on_nvme) {
    o.memory.enabled = true;
    o.memory.budgets.pinned_ram = uint64_t{1} << 30;
    o.memory.budgets.ram = uint64_t{1} << 30;
    o.memory.budgets.nvme_dir = nvme_dir;
    o.memory.budgets.nvme_bytes = uint64_t{256} << 20;
    o.memory.grad_on_nvme = true;
    o.memory.states_on_nvme = true;  // the gradients move after m and v
  }
  auto device = MakeCpuDevice(size_t{128} << 20);
  auto trainer = Trainer::Create(*device, config, o);
  EXPECT_TRUE(trainer.ok()) << c.name << ": " << trainer.status();
  if (!trainer.ok()) return out;
  (*trainer)->InitializeRandom(11);
  out.gradient_sums = (*trainer)->executor().plan().gradient_sums;
  out.resolved = (*trainer)->executor().gradient_accumulation();
  const auto batches =
      MakeTokenBatches(kSteps * kAccumulation, kMicroBatch * kSeq, shape.vocab, 41);
  for (int step = 0; step < kSteps; ++step) {
    auto report = (*trainer)->Step(batches.InputPointers(kAccumulation * step, kAccumulation),
                                   batches.TargetPointers(kAccumulation * step, kAccumulation));
    EXPECT_TRUE(report.ok()) << c.name << ": " << report.status();
    if (!report.ok()) return out;
    out.losses.push_back(report->loss);
    for (const DeviceStepFigures& d : report->devices) out.link_bytes += d.link_bytes;
  }
  (*trainer)->WaitForUpdates();
  for (const LayoutEntry& entry : (*trainer)->layout().entries()) {
    for (const TensorSlot& slot : entry.tensors) {
      absl::StatusOr<std::vector<float>> g = (*trainer)->ReadGradient(slot.hf_name);
      absl::StatusOr<std::vector<float>> w = (*trainer)->ReadTensor(slot.hf_name);
      EXPECT_TRUE(g.ok() && w.ok()) << slot.hf_name;
      if (!g.ok() || !w.ok()) return out;
      out.gradients.push_back(*std::move(g));
      out.masters.push_back(*std::move(w));
    }
  }
  return out;
}

class DeviceGradientSumsTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceGradientSumsTest, SameBitsAsTheHostSumsAndFewerBytesOut) {
  const Case& c = GetParam();
  std::string dir;
  if (c.grad_on_nvme) {
    absl::Status usable;
    dir = tiers::FreshTestDir("device_gradient_sums_" + c.name, &usable);
    if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  }
  const Outcome host = Train(c, GradientAccumulation::kHost, dir);
  const Outcome device = Train(c, GradientAccumulation::kDevice, dir);
  ASSERT_EQ(host.losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(device.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(host.resolved, GradientAccumulation::kHost);
  EXPECT_EQ(device.resolved, GradientAccumulation::kDevice);
  EXPECT_EQ(host.gradient_sums, 0u);
  EXPECT_GT(device.gradient_sums, 0u);
  testing::ExpectSameLosses(host.losses, device.losses, c.name);
  testing::ExpectSameArrays(host.gradients, device.gradients, c.name + " gradients");
  testing::ExpectSameArrays(host.masters, device.masters, c.name + " masters");
  // Layer gradients leave once a step instead of once per micro-batch: with 3 micro-batches the
  // copy-out of the layers' gradients shrinks to a third (weights in are unchanged).
  EXPECT_LT(device.link_bytes, host.link_bytes) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Placements, DeviceGradientSumsTest,
    ::testing::Values(Case{"untied_slots", false, 0, false}, Case{"tied_slots", true, 0, false},
                      Case{"untied_ring", false, 1.5, false}, Case{"tied_ring", true, 1.5, false},
                      Case{"untied_nvme_gradients", false, 0, true},
                      Case{"wide_layers", false, 0, false, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// RunMicroBatch called directly with any sequence of first/last flags: the device executor's
// slabs are the host executor's bit for bit after every step, including a step whose first
// micro-batch also said it was the last (no sums started: the later ones add on the host), and
// the arena holds exactly the plan, sums included.
TEST(DeviceGradientSumsExecutorTest, AnyFirstAndLastFlagsGiveTheHostSlabs) {
  TinyShape shape;
  shape.layers = 2;
  constexpr int kRigSeq = 16;
  ExecutorOptions host_options;
  host_options.weight_slots = 2;
  ExecutorOptions device_options = host_options;
  device_options.gradient_accumulation = GradientAccumulation::kDevice;
  absl::StatusOr<testing::ExecutorRig> host =
      testing::MakeExecutorRig(shape, kRigSeq, StorePlacement{}, host_options);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<testing::ExecutorRig> device =
      testing::MakeExecutorRig(shape, kRigSeq, StorePlacement{}, device_options);
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_EQ(device->executor->gradient_accumulation(), GradientAccumulation::kDevice);
  ASSERT_GT(device->executor->plan().gradient_sums, 0u);
  EXPECT_EQ(device->device->arena_stats().in_use, device->executor->plan().total());

  struct Call {
    bool first, last;
  };
  const std::vector<std::vector<Call>> steps = {
      {{true, true}},
      {{true, false}, {false, false}, {false, true}},
      {{true, true}, {false, true}},  // the first said last: the second adds on the host
      {{true, false}, {false, true}},
      {{true, true}, {false, true}, {false, true}},
  };
  const testing::TokenBatches batches = MakeTokenBatches(12, kRigSeq, shape.vocab, 5);
  int next = 0;
  for (size_t step = 0; step < steps.size(); ++step) {
    for (const Call& call : steps[step]) {
      for (testing::ExecutorRig* rig : {&*host, &*device}) {
        absl::StatusOr<MicroBatchResult> r = rig->executor->RunMicroBatch(
            batches.inputs[next].data(), batches.targets[next].data(), 1.0f / 64, call.first, 0,
            {}, {}, nullptr, call.last);
        ASSERT_TRUE(r.ok()) << r.status();
      }
      ++next;
    }
    std::vector<std::vector<float>> host_slabs, device_slabs;
    for (int e = 0; e < host->store->num_entries(); ++e) {
      const size_t n = host->store->spec(e).elements;
      host_slabs.emplace_back(host->store->entry(e).grad, host->store->entry(e).grad + n);
      device_slabs.emplace_back(device->store->entry(e).grad, device->store->entry(e).grad + n);
    }
    testing::ExpectSameArrays(host_slabs, device_slabs, absl::StrCat("step ", step));
  }
}

// One micro-batch a step has nothing to sum: the executor copies straight out, and the run's rule
// keeps auto off the device for it.
TEST(DeviceGradientSumsRuleTest, RunRuleAndParsing) {
  EXPECT_EQ(*GradientAccumulationForRun(GradientAccumulation::kAuto, 1, 1),
            GradientAccumulation::kHost);
  EXPECT_EQ(*GradientAccumulationForRun(GradientAccumulation::kAuto, 4, 1),
            GradientAccumulation::kAuto);
  EXPECT_EQ(*GradientAccumulationForRun(GradientAccumulation::kDevice, 1, 1),
            GradientAccumulation::kDevice);
  EXPECT_EQ(*GradientAccumulationForRun(GradientAccumulation::kAuto, 4, 2),
            GradientAccumulation::kHost);
  const absl::StatusOr<GradientAccumulation> refused =
      GradientAccumulationForRun(GradientAccumulation::kDevice, 4, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("gradient_accumulation=device"), std::string::npos);
  EXPECT_EQ(*ParseGradientAccumulation("device"), GradientAccumulation::kDevice);
  EXPECT_EQ(*ParseGradientAccumulation("host"), GradientAccumulation::kHost);
  EXPECT_EQ(*ParseGradientAccumulation("auto"), GradientAccumulation::kAuto);
  const absl::StatusOr<GradientAccumulation> bad = ParseGradientAccumulation("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"gpu\""), std::string::npos);
}

// Auto: the device on CUDA when the sums fit beside the minimum plan, the host otherwise and on
// the CPU device; the sums are counted in the plan (and the tied embedding is not summed).
TEST(DeviceGradientSumsRuleTest, AutoResolvesByDeviceAndArena) {
  TinyShape shape;
  shape.layers = 3;
  shape.vocab = 301;
  shape.tied = true;
  const ModelConfig config = TinyConfig(shape);
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  ASSERT_TRUE(layout.ok());
  ExecutorOptions options;
  absl::StatusOr<ExecutorGeometry> g =
      MakeExecutorGeometry(config, *layout, kMicroBatch, kSeq, /*head_chunk=*/16);
  ASSERT_TRUE(g.ok());
  options.gradient_accumulation = GradientAccumulation::kAuto;
  const size_t big = size_t{1} << 30;
  auto resolve = [&](size_t arena, DeviceKind kind) {
    return StreamingExecutor::ResolveGradientAccumulation(g->dims, g->layout, g->entry_elements,
                                                          options, arena, kind);
  };
  EXPECT_EQ(resolve(big, DeviceKind::kCpu), GradientAccumulation::kHost);
  EXPECT_EQ(resolve(big, DeviceKind::kCuda), GradientAccumulation::kDevice);

  ExecutorOptions device = options;
  device.gradient_accumulation = GradientAccumulation::kDevice;
  device.device_checkpoints = 0;
  const DeviceMemoryPlan with_sums = StreamingExecutor::PlanDeviceMemory(
      g->dims, g->layout, g->entry_elements, device, 2, DeviceKind::kCuda);
  ExecutorOptions host = device;
  host.gradient_accumulation = GradientAccumulation::kHost;
  const DeviceMemoryPlan without = StreamingExecutor::PlanDeviceMemory(
      g->dims, g->layout, g->entry_elements, host, 2, DeviceKind::kCuda);
  // Every entry but the tied embedding, in fp32.
  size_t summed_bytes = 0;
  for (size_t e = 0; e < g->entry_elements.size(); ++e) {
    if (static_cast<int>(e) == layout->embedding_entry()) continue;
    summed_bytes += (g->entry_elements[e] * sizeof(float) + 255) / 256 * 256;
  }
  EXPECT_EQ(with_sums.gradient_sums, summed_bytes);
  EXPECT_EQ(without.gradient_sums, 0u);
  EXPECT_EQ(with_sums.total(), without.total() + summed_bytes);
  // An arena that holds the minimum plan but not the sums stays on the host.
  EXPECT_EQ(resolve(without.total() + summed_bytes / 2, DeviceKind::kCuda),
            GradientAccumulation::kHost);
}

// A device checkpoint count the caller fixed is part of the plan auto must fit the sums beside:
// here the checkpoints outweigh the sums, so dropping them from the probe would pick the device
// and then fail to allocate.
TEST(DeviceGradientSumsRuleTest, AutoKeepsAFixedCheckpointCount) {
  TinyShape shape;
  shape.layers = 12;
  const ModelConfig config = TinyConfig(shape);
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  ASSERT_TRUE(layout.ok());
  ExecutorOptions options;
  options.checkpoint_interval = 1;
  absl::StatusOr<ExecutorGeometry> g = MakeExecutorGeometry(config, *layout, /*micro_batch=*/8,
                                                            /*seq=*/2048, /*head_chunk=*/16);
  ASSERT_TRUE(g.ok());
  options.gradient_accumulation = GradientAccumulation::kHost;
  options.device_checkpoints = 11;  // every checkpoint on the device
  const DeviceMemoryPlan host = StreamingExecutor::PlanDeviceMemory(
      g->dims, g->layout, g->entry_elements, options, 2, DeviceKind::kCuda);
  ExecutorOptions device = options;
  device.gradient_accumulation = GradientAccumulation::kDevice;
  const size_t sums = StreamingExecutor::PlanDeviceMemory(g->dims, g->layout, g->entry_elements,
                                                          device, 2, DeviceKind::kCuda)
                          .gradient_sums;
  ASSERT_GT(host.checkpoints, 2 * sums);  // the case that matters
  options.gradient_accumulation = GradientAccumulation::kAuto;
  // Room for the fixed plan and half the sums (and the 1/16 margin): not enough for the sums.
  const size_t arena = (host.total() + sums / 2) * 17 / 16;
  EXPECT_EQ(StreamingExecutor::ResolveGradientAccumulation(g->dims, g->layout, g->entry_elements,
                                                           options, arena, DeviceKind::kCuda),
            GradientAccumulation::kHost);
  // With auto checkpoints they yield to the sums instead.
  options.device_checkpoints = kAutoDeviceCheckpoints;
  EXPECT_EQ(StreamingExecutor::ResolveGradientAccumulation(g->dims, g->layout, g->entry_elements,
                                                           options, arena, DeviceKind::kCuda),
            GradientAccumulation::kDevice);
}

// Several devices of one process always sum on the host: auto becomes host at Trainer::Create,
// device is refused there naming the field (not at the first step).
TEST(DeviceGradientSumsRuleTest, SeveralDevicesSumOnTheHost) {
  TinyShape shape;
  shape.layers = 2;
  auto first = MakeCpuDevice(size_t{64} << 20);
  auto second = MakeCpuDevice(size_t{64} << 20);
  TrainerOptions o;
  o.micro_batch_size = 1;
  o.seq_len = 16;
  o.executor.weight_slots = 2;
  o.executor.gradient_accumulation = GradientAccumulation::kDevice;
  auto refused = Trainer::Create({first.get(), second.get()}, TinyConfig(shape), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("gradient_accumulation=device"), std::string::npos)
      << refused.status();
  o.executor.gradient_accumulation = GradientAccumulation::kAuto;
  auto trainer = Trainer::Create({first.get(), second.get()}, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->executor().gradient_accumulation(), GradientAccumulation::kHost);
}

}  // namespace
}  // namespace megatrain::engine
