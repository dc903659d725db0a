// The planner's device plan (computed from the layout, without allocating) equals what a real
// Trainer's executor allocates from the arena, and the slot count its auto rule picks, across
// shapes, k, keep_all, host checkpoints and tied embeddings.
#include <gtest/gtest.h>

#include "engine/exec/streaming_executor.h"
#include "engine/model/parameter_layout.h"
#include "engine/planner/executor_geometry.h"
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

}  // namespace
}  // namespace megatrain::engine::planner
