// The planner's device plan (computed from the layout, without allocating) equals what a real
// Trainer's executor allocates from the arena, and the slot count its auto rule picks, across
// shapes, k, keep_all, host checkpoints and tied embeddings.
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/parameter_layout.h"
#include "engine/planner/executor_geometry.h"
#include "engine/planner/planner.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine::planner {
namespace {

struct Case {
  testing::TinyShape shape;
  int batch, seq, k;
  bool keep_all;
  int device_checkpoints, weight_slots;
};

TEST(DevicePlanTest, EqualsTheExecutorsPlan) {
  testing::TinyShape tied;
  tied.tied = true;
  testing::TinyShape wide;
  wide.layers = 7;
  wide.hidden = 80;
  wide.ffn = 200;
  wide.heads = 5;
  wide.kv_heads = 1;
  wide.vocab = 131;
  const Case cases[] = {
      {testing::TinyShape{}, 2, 17, 4, false, -1, 2},
      {tied, 3, 9, 1, false, 1, 2},
      {wide, 1, 33, 3, false, 0, 3},
      {wide, 2, 8, 2, true, -1, 2},
      {wide, 5, 7, 5, false, 1, 0},
  };
  for (const Case& c : cases) {
    const ModelConfig config = testing::TinyConfig(c.shape);
    auto layout = ParameterLayout::Create(config);
    ASSERT_TRUE(layout.ok());
    ExecutorOptions options;
    options.checkpoint_interval = c.k;
    options.keep_all = c.keep_all;
    options.device_checkpoints = c.device_checkpoints;
    options.weight_slots = c.weight_slots;
    auto g = MakeExecutorGeometry(config, *layout, c.batch, c.seq, 0, options);
    ASSERT_TRUE(g.ok()) << g.status();
    auto device = testing::MakeCpuDevice(size_t{64} << 20);
    TrainerOptions o;
    o.micro_batch_size = c.batch;
    o.seq_len = c.seq;
    o.executor = options;
    auto trainer = Trainer::Create(*device, config, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const int slots = WeightSlotsFor(*g, options, size_t{64} << 20, DeviceKind::kCpu);
    EXPECT_EQ(slots, (*trainer)->executor().weight_slots());
    const DeviceMemoryPlan want = (*trainer)->executor().plan();
    const DeviceMemoryPlan got = DeviceMemoryPlanFor(*g, options, slots, DeviceKind::kCpu);
    EXPECT_EQ(device->arena_stats().in_use, want.total());
    EXPECT_EQ(got.weight_slots, want.weight_slots);
    EXPECT_EQ(got.gradient_buffers, want.gradient_buffers);
    EXPECT_EQ(got.activations, want.activations);
    EXPECT_EQ(got.checkpoints, want.checkpoints);
    EXPECT_EQ(got.scratch, want.scratch);
    EXPECT_EQ(got.total(), want.total());
  }
}

// The slot count of the auto rule matches what a real Trainer's executor picked.
TEST(DevicePlanTest, AutoWeightSlotsMatchTheTrainer) {
  testing::TinyShape s;
  s.layers = 6;
  const ModelConfig config = testing::TinyConfig(s);
  for (size_t arena : {size_t{2} << 20, size_t{4} << 20, size_t{64} << 20}) {
    TrainerOptions o;
    o.micro_batch_size = 2;
    o.seq_len = 16;
    o.executor.weight_slots = 0;
    auto device = testing::MakeCpuDevice(arena);
    auto trainer = Trainer::Create(*device, config, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto layout = ParameterLayout::Create(config);
    auto g = MakeExecutorGeometry(config, *layout, 2, 16, 0, o.executor);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(WeightSlotsFor(*g, o.executor, arena, DeviceKind::kCpu),
              (*trainer)->executor().weight_slots())
        << arena;
    EXPECT_EQ(
        DeviceMemoryPlanFor(*g, o.executor, (*trainer)->executor().weight_slots(), DeviceKind::kCpu)
            .total(),
        (*trainer)->executor().plan().total());
  }
}

// The CPU device as a planner profile (speeds only shape the predicted activation modes).
HardwareProfile CpuProfile(size_t arena_bytes) {
  HardwareProfile hw;
  hw.name = "test-cpu-device";
  hw.cpu_device = true;
  hw.device_memory_bytes = arena_bytes;
  hw.dense_tflops = 0.1;
  hw.device_memory_gbps = hw.memcpy_gbps = hw.host_memory_gbps = 10;
  hw.weight_bytes = hw.activation_bytes = hw.grad_bytes = 4;
  return hw;
}

// Fragment mode: Plan() with a ring of one layer (and half a layer, and odd bytes) predicts the
// arena peak a real Trainer measures over steps, exactly; its fragment count is the executor's.
TEST(DevicePlanTest, WeightRingPlanEqualsTheMeasuredArenaPeak) {
  testing::TinyShape shape;
  shape.layers = 5;
  const ModelConfig config = testing::TinyConfig(shape);
  const size_t arena = size_t{64} << 20;
  for (const double layers : {1.0, 0.5, 2.3}) {
    SCOPED_TRACE(layers);
    PlanInputs in;
    in.micro_batch = 2;
    in.seq = 19;
    in.checkpoint_interval = 2;
    in.weight_ring_layers = layers;
    in.fragment_bytes = layers == 0.5 ? 700 : 0;
    in.device_arena_bytes = arena;
    absl::StatusOr<PlanResult> plan = Plan(config, in, CpuProfile(arena));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->device.weight_ring);

    TrainerOptions o;
    o.micro_batch_size = in.micro_batch;
    o.seq_len = in.seq;
    o.executor.checkpoint_interval = in.checkpoint_interval;
    o.executor.weight_ring_bytes = plan->executor.weight_ring_bytes;
    o.executor.fragment_bytes = plan->executor.fragment_bytes;
    auto device = testing::MakeCpuDevice(arena);
    auto trainer = Trainer::Create(*device, config, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->executor().fragment_mode());
    EXPECT_EQ(plan->step_fragments, (*trainer)->executor().step_fragment_count());
    (*trainer)->InitializeRandom(3);
    const auto batches = testing::MakeTokenBatches(4, in.micro_batch * in.seq, shape.vocab, 5);
    uint64_t measured = 0;
    for (int step = 0; step < 2; ++step) {
      auto report =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(report.ok()) << report.status();
      measured = std::max<uint64_t>(measured, report->device_arena_peak_bytes);
    }
    measured = std::max<uint64_t>(measured, device->arena_stats().peak);
    EXPECT_EQ(plan->device_arena_peak, measured) << plan->device.Describe();
    EXPECT_EQ(plan->device.total(), (*trainer)->executor().plan().total());
  }
}

double CopyOutBytes(const PlanResult& plan) {
  double bytes = 0;
  for (const OpWork& op : plan.work.ops) bytes += op.copy_out_bytes;
  return bytes;
}

// Auto device checkpoints: for arenas holding all, some and none of them, Plan() picks the
// executor's count, slots, arena plan and pinned staging, and its step charges the host ones'
// copies out.
TEST(DevicePlanTest, AutoDeviceCheckpointsMatchTheTrainer) {
  testing::TinyShape shape;
  shape.layers = 10;
  const ModelConfig config = testing::TinyConfig(shape);
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 21;
  in.checkpoint_interval = 1;  // nine checkpoints: the top layer keeps its activations
  in.weight_slots = 0;
  in.device_checkpoints = kAutoDeviceCheckpoints;
  auto layout = ParameterLayout::Create(config);
  ASSERT_TRUE(layout.ok());
  ExecutorOptions options;
  options.checkpoint_interval = 1;
  auto g = MakeExecutorGeometry(config, *layout, in.micro_batch, in.seq, 0, options);
  ASSERT_TRUE(g.ok()) << g.status();
  options.device_checkpoints = 0;
  const size_t none = DeviceMemoryPlanFor(*g, options, 2, DeviceKind::kCpu).total();
  options.device_checkpoints = 1;
  const size_t x_bytes = DeviceMemoryPlanFor(*g, options, 2, DeviceKind::kCpu).checkpoints;
  const size_t big = size_t{64} << 20;

  absl::StatusOr<PlanResult> all = Plan(config, [&] {
    PlanInputs i = in;
    i.device_arena_bytes = big;
    return i;
  }(), CpuProfile(big));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->device.device_checkpoints, 9);
  for (const auto& [arena, on_device] :
       {std::pair<size_t, int>{big, 9}, {none + 4 * x_bytes + 100, 4}, {none, 0}}) {
    SCOPED_TRACE(arena);
    in.device_arena_bytes = arena;
    absl::StatusOr<PlanResult> plan = Plan(config, in, CpuProfile(arena));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->fits_device);
    EXPECT_EQ(plan->device.device_checkpoints, on_device);
    EXPECT_EQ(plan->executor.device_checkpoints, on_device);

    TrainerOptions o;
    o.micro_batch_size = in.micro_batch;
    o.seq_len = in.seq;
    o.executor.checkpoint_interval = 1;
    auto device = testing::MakeCpuDevice(arena);
    auto trainer = Trainer::Create(*device, config, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const DeviceMemoryPlan& executor_plan = (*trainer)->executor().plan();
    EXPECT_EQ(plan->device.device_checkpoints, executor_plan.device_checkpoints);
    EXPECT_EQ(plan->device.host_checkpoints, executor_plan.host_checkpoints);
    EXPECT_EQ(plan->weight_slots, (*trainer)->executor().weight_slots());
    EXPECT_EQ(plan->device.total(), executor_plan.total());
    EXPECT_EQ(device->arena_stats().in_use, executor_plan.total());
    ExecutorOptions resolved = o.executor;
    resolved.device_checkpoints = executor_plan.device_checkpoints;
    EXPECT_EQ(plan->host_pinned_staging,
              StreamingExecutor::PinnedStagingBytes(g->dims, g->layout, g->entry_elements,
                                                    resolved, DeviceKind::kCpu));
    // Each host checkpoint goes out once per micro-batch (and back before its recompute); the
    // top block keeps its activations and has no checkpoint.
    const double host_bytes = static_cast<double>(std::max(0, 9 - on_device)) * in.micro_batch *
                              in.seq * shape.hidden * sizeof(float);
    EXPECT_EQ(CopyOutBytes(*plan) - CopyOutBytes(*all), host_bytes);
  }
}

// A pinned budget the store's copy endpoints fill exactly: the executors' pinned staging (one
// per device) is set aside first, so the master yields to it and goes pageable (the Trainer
// failed at its executor's pinned allocation before). The run trains, and the planner's
// placement is the Trainer's, for one device and two.
TEST(DevicePlanTest, ExecutorStagingComesOutOfThePinnedBudgetFirst) {
  testing::TinyShape shape;
  const ModelConfig config = testing::TinyConfig(shape);
  const size_t arena = size_t{64} << 20;
  auto layout = ParameterLayout::Create(config);
  ASSERT_TRUE(layout.ok()) << layout.status();
  uint64_t store_floats = 0;
  for (const LayoutEntry& e : layout->entries()) store_floats += e.num_elements;
  const uint64_t endpoints = 2 * store_floats * sizeof(float);  // gradients + master
  for (int devices : {1, 2}) {
    SCOPED_TRACE(devices);
    TrainerOptions o;
    o.micro_batch_size = 2;
    o.seq_len = 11;
    o.lr.total_steps = 1;
    o.memory.enabled = true;
    o.memory.budgets.pinned_ram = endpoints;
    o.memory.budgets.ram = uint64_t{1} << 30;
    auto g = MakeExecutorGeometry(config, *layout, o.micro_batch_size, o.seq_len, 0, o.executor);
    ASSERT_TRUE(g.ok()) << g.status();
    const uint64_t staging =
        ExecutorPinnedStagingBytes(*g, o.executor, arena, DeviceKind::kCpu, devices);
    ASSERT_GT(staging, 0u);
    ASSERT_LE(staging, endpoints / 2);  // the gradients still fit beside it

    std::vector<std::unique_ptr<CpuDevice>> owned;
    std::vector<Device*> pointers;
    for (int d = 0; d < devices; ++d) {
      DeviceOptions device_options;
      device_options.arena_bytes = arena;
      device_options.pinned_budget_bytes = endpoints;  // the user's pinned budget, per device
      auto created = CpuDevice::Create(device_options);
      ASSERT_TRUE(created.ok()) << created.status();
      owned.push_back(std::move(*created));
      pointers.push_back(owned.back().get());
    }
    auto trainer = Trainer::Create(pointers, config, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const std::string table = (*trainer)->placement_table();
    EXPECT_NE(table.find("master        ram     "), std::string::npos) << table;
    EXPECT_NE(table.find("(pageable: pinned budget full)"), std::string::npos) << table;
    EXPECT_NE(table.find("grad          pinned  "), std::string::npos) << table;
    EXPECT_NE(table.find(absl::StrCat("(+", staging, " executor staging)")), std::string::npos)
        << table;
    EXPECT_LE(owned[0]->pinned_stats().in_use, endpoints);

    (*trainer)->InitializeRandom(3);
    const auto batches = testing::MakeTokenBatches(2, 2 * 11, shape.vocab, 7);
    absl::StatusOr<StepReport> step =
        (*trainer)->Step(batches.InputPointers(0, 2), batches.TargetPointers(0, 2));
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_GT(step->loss, 0);

    PlanInputs in;
    in.micro_batch = o.micro_batch_size;
    in.seq = o.seq_len;
    in.checkpoint_interval = o.executor.checkpoint_interval;
    in.weight_slots = o.executor.weight_slots;
    in.device_arena_bytes = arena;
    in.devices = devices;
    in.budgets_enabled = true;
    in.budgets = o.memory.budgets;
    absl::StatusOr<PlanResult> plan = Plan(config, in, CpuProfile(arena));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->pinned_reserved, staging);
    EXPECT_EQ(plan->placement.Table(), table);
  }
}

// A ring smaller than the largest tensor: the planner refuses it with the executor's message.
TEST(DevicePlanTest, TooSmallRingIsRefusedWithTheExecutorsMessage) {
  testing::TinyShape shape;
  const ModelConfig config = testing::TinyConfig(shape);
  const size_t arena = size_t{64} << 20;
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 11;
  in.weight_ring_bytes = 5000;  // below the LM head's 97 x 48 floats
  in.device_arena_bytes = arena;
  const absl::StatusOr<PlanResult> plan = Plan(config, in, CpuProfile(arena));
  ASSERT_FALSE(plan.ok());
  TrainerOptions o;
  o.micro_batch_size = in.micro_batch;
  o.seq_len = in.seq;
  o.executor.weight_ring_bytes = in.weight_ring_bytes;
  auto device = testing::MakeCpuDevice(arena);
  auto trainer = Trainer::Create(*device, config, o);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(plan.status(), trainer.status());
  EXPECT_NE(plan.status().message().find("weight_ring_bytes=5000"), std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace megatrain::engine::planner
