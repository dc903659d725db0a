// The streaming contract: losses and weights after 5 steps are bitwise
// identical whatever the arena size (every stage resident, or just two weight
// slots), the checkpoint interval k (1, 2, 4, keep-all), where checkpoints
// live (device or host), the link throttle, and overlap on or off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/engine/bitwise_compare.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

struct RunConfig {
  std::string name;
  size_t arena_bytes = size_t{256} << 20;
  int weight_slots = 0;
  int k = 4;
  bool keep_all = false;
  int device_checkpoints = -1;
  double link_gbps = 0;
  bool serial = false;
};

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> masters;
  int weight_slots = 0;
};

RunResult Train(const RunConfig& rc, const TinyShape& shape) {
  RunResult result;
  auto device = MakeCpuDevice(rc.arena_bytes, rc.link_gbps, rc.link_gbps > 0 ? 5 : 0);
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 23;
  o.head_chunk = 16;
  o.lr.peak_lr = 3e-3;
  o.lr.warmup_steps = 2;
  o.lr.total_steps = 5;
  o.grad_clip = 0.5;
  o.executor.checkpoint_interval = rc.k;
  o.executor.keep_all = rc.keep_all;
  o.executor.device_checkpoints = rc.device_checkpoints;
  o.executor.weight_slots = rc.weight_slots;
  o.executor.serial = rc.serial;
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  EXPECT_TRUE(trainer.ok()) << rc.name << ": " << trainer.status();
  if (!trainer.ok()) return result;
  (*trainer)->InitializeRandom(7);
  const auto batches = MakeTokenBatches(10, 2 * 23, shape.vocab, 99);
  for (int step = 0; step < 5; ++step) {
    auto report =
        (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    EXPECT_TRUE(report.ok()) << rc.name << ": " << report.status();
    if (!report.ok()) return result;
    result.losses.push_back(report->loss);
  }
  (*trainer)->WaitForUpdates();
  const ParameterStore& store = (*trainer)->store();
  for (int e = 0; e < store.num_entries(); ++e) {
    const float* p = store.entry(e).master;
    result.masters.emplace_back(p, p + store.spec(e).elements);
  }
  result.weight_slots = (*trainer)->executor().weight_slots();
  return result;
}

void ExpectBitwiseEqual(const RunResult& a, const RunResult& b, const std::string& name) {
  testing::ExpectSameLosses(a.losses, b.losses, name);
  testing::ExpectSameArrays(a.masters, b.masters, name + " masters");
}

TEST(InvarianceTest, ResultsAreBitwiseIdenticalAcrossMemoryAndScheduleChoices) {
  for (bool tied : {false, true}) {
    TinyShape shape;
    shape.layers = 5;
    shape.tied = tied;
    const RunResult reference = Train({.name = "resident, k=4"}, shape);
    ASSERT_EQ(reference.losses.size(), 5u);
    EXPECT_GT(reference.weight_slots, 2) << "a large arena keeps stages resident";
    for (double loss : reference.losses) EXPECT_TRUE(std::isfinite(loss));
    const std::vector<RunConfig> variants = {
        {.name = "two slots, k=1", .weight_slots = 2, .k = 1},
        {.name = "two slots, k=2", .weight_slots = 2, .k = 2},
        {.name = "two slots, k=4", .weight_slots = 2, .k = 4},
        {.name = "two slots, keep-all", .weight_slots = 2, .keep_all = true},
        {.name = "host checkpoints, k=2", .weight_slots = 2, .k = 2, .device_checkpoints = 0},
        {.name = "throttled link, k=2", .weight_slots = 2, .k = 2, .link_gbps = 2.0},
        {.name = "serial, k=1", .weight_slots = 2, .k = 1, .serial = true},
        {.name = "three slots, host checkpoints, throttled",
         .weight_slots = 3,
         .k = 1,
         .device_checkpoints = 1,
         .link_gbps = 4.0},
    };
    for (const RunConfig& rc : variants) {
      ExpectBitwiseEqual(reference, Train(rc, shape), rc.name + (tied ? " (tied)" : ""));
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
