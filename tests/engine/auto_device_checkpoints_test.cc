// Auto device checkpoints (ExecutorOptions::device_checkpoints = -1, the default): the executor
// keeps as many activation checkpoints on the device as the arena holds beside the minimum plan,
// the rest in pinned host memory; training is bitwise that of an arena holding them all, and an
// arena below the minimum plan still fails naming the bytes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/exec/executor_geometry.h"
#include "engine/model/parameter_layout.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr int kBatch = 2;
constexpr int kSeq = 23;
constexpr int kHeadChunk = 16;
constexpr int kSteps = 3;

TinyShape Deep() {
  TinyShape shape;
  shape.layers = 13;  // k = 1: twelve checkpoints (the top layer keeps its activations)
  return shape;
}

TrainerOptions Options(int device_checkpoints) {
  TrainerOptions o;
  o.micro_batch_size = kBatch;
  o.seq_len = kSeq;
  o.head_chunk = kHeadChunk;
  o.lr.peak_lr = 3e-3;
  o.lr.warmup_steps = 1;
  o.lr.total_steps = kSteps;
  o.executor.checkpoint_interval = 1;
  o.executor.device_checkpoints = device_checkpoints;
  return o;
}

// The device plan with exactly `device_checkpoints` on the device and two weight slots.
DeviceMemoryPlan PlanWith(int device_checkpoints) {
  const ModelConfig config = TinyConfig(Deep());
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  if (!layout.ok()) abort();
  absl::StatusOr<ExecutorGeometry> g =
      MakeExecutorGeometry(config, *layout, kBatch, kSeq, kHeadChunk);
  if (!g.ok()) abort();
  return StreamingExecutor::PlanDeviceMemory(g->dims, g->layout, g->entry_elements,
                                             Options(device_checkpoints).executor, 2);
}

struct TrainedRun {
  DeviceMemoryPlan plan;
  std::vector<double> losses;
};

TrainedRun Train(size_t arena_bytes, int device_checkpoints = kAutoDeviceCheckpoints) {
  TrainedRun run;
  auto device = MakeCpuDevice(arena_bytes);
  auto trainer = Trainer::Create(*device, TinyConfig(Deep()), Options(device_checkpoints));
  EXPECT_TRUE(trainer.ok()) << arena_bytes << ": " << trainer.status();
  if (!trainer.ok()) return run;
  run.plan = (*trainer)->executor().plan();
  EXPECT_EQ(device->arena_stats().in_use, run.plan.total()) << arena_bytes;
  EXPECT_LE(run.plan.total(), arena_bytes);
  (*trainer)->InitializeRandom(7);
  const auto batches = MakeTokenBatches(kSteps, kBatch * kSeq, Deep().vocab, 99);
  for (int step = 0; step < kSteps; ++step) {
    auto report =
        (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
    EXPECT_TRUE(report.ok()) << report.status();
    if (report.ok()) run.losses.push_back(report->loss);
  }
  return run;
}

TEST(AutoDeviceCheckpointsTest, KeepsTheMostThatFitAndTrainsBitwiseTheSame) {
  const DeviceMemoryPlan all = PlanWith(12);
  const DeviceMemoryPlan none = PlanWith(0);
  const size_t x_bytes = PlanWith(1).checkpoints;
  ASSERT_EQ(all.device_checkpoints, 12);
  ASSERT_GT(x_bytes, 0u);
  // The staging buffer a host checkpoint needs makes "all but one" cost as much as all.
  ASSERT_EQ(none.total() + 11 * x_bytes, all.total());

  const TrainedRun reference = Train(size_t{256} << 20);
  EXPECT_EQ(reference.plan.device_checkpoints, 12);
  EXPECT_EQ(reference.plan.host_checkpoints, 0);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));

  struct Case {
    size_t arena;
    int on_device;
  };
  const Case cases[] = {
      {all.total(), 12},                           // all fit, nothing to spare
      {all.total() - 1, 10},                       // one byte short: the staging buffer joins
      {none.total() + 5 * x_bytes + x_bytes / 2, 5},  // some fit
      {none.total(), 0},                           // none fit, the minimum plan does
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("arena ", c.arena));
    const TrainedRun run = Train(c.arena);
    EXPECT_EQ(run.plan.device_checkpoints, c.on_device);
    EXPECT_EQ(run.plan.host_checkpoints, 12 - c.on_device);
    EXPECT_EQ(run.plan.checkpoints, static_cast<size_t>(c.on_device) * x_bytes);
    EXPECT_EQ(run.plan.weight_slots, all.weight_slots);  // extra slots come after checkpoints
    ASSERT_EQ(run.losses.size(), reference.losses.size());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(run.losses[s], reference.losses[s]) << "step " << s + 1;  // bitwise
    }
  }
}

TEST(AutoDeviceCheckpointsTest, BelowTheMinimumPlanFailsNamingTheBytes) {
  const size_t arena = PlanWith(0).total() - 256;
  auto device = MakeCpuDevice(arena);
  auto trainer = Trainer::Create(*device, TinyConfig(Deep()), Options(kAutoDeviceCheckpoints));
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(trainer.status().message());
  EXPECT_NE(message.find(absl::StrCat("needs ", PlanWith(0).total(), " bytes")),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(absl::StrCat("capacity ", arena)), std::string::npos) << message;
  EXPECT_NE(message.find("0 checkpoints on the device, 12 in pinned host memory"),
            std::string::npos)
      << message;
}

TEST(AutoDeviceCheckpointsTest, ExplicitCountsStayExplicit) {
  const TrainedRun three = Train(size_t{256} << 20, 3);
  EXPECT_EQ(three.plan.device_checkpoints, 3);
  EXPECT_EQ(three.plan.host_checkpoints, 9);
  const TrainedRun clamped = Train(size_t{256} << 20, 100);
  EXPECT_EQ(clamped.plan.device_checkpoints, 12);
  EXPECT_EQ(clamped.plan.host_checkpoints, 0);

  auto device = MakeCpuDevice(size_t{256} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(Deep()), Options(-2));
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find("device_checkpoints=-2"), std::string::npos)
      << trainer.status();
}

}  // namespace
}  // namespace megatrain::engine
