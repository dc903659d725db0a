// Shared fixtures of the tier tests: a deep, narrow tiny model, five steps of
// two micro-batches, and bit-for-bit comparison of losses, masters, m, v and
// a probe tensor's weights and gradient wherever they live.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/train/trainer.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine::tiered_training {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

inline TinyShape DeepNarrow() {
  TinyShape s;
  s.layers = 24;
  s.hidden = 128;
  s.ffn = 344;
  s.heads = 4;
  s.kv_heads = 2;
  s.vocab = 97;
  return s;
}

// `n` CPU devices of `arena_bytes` each, and the pointers Trainer::Create takes.
struct CpuDevices {
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> pointers;
};
// `later_latency_us`: devices 1.. add that latency to every copy (device 0 none), so their
// copies land well after device 0's.
inline CpuDevices MakeCpuDevices(int n, size_t arena_bytes = size_t{32} << 20,
                                 double later_latency_us = 0) {
  CpuDevices devices;
  for (int d = 0; d < n; ++d) {
    devices.owned.push_back(MakeCpuDevice(arena_bytes, 0, d > 0 ? later_latency_us : 0));
    devices.pointers.push_back(devices.owned.back().get());
  }
  return devices;
}

inline TrainerOptions BaseOptions() {
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 24;
  o.lr.peak_lr = 2e-3;
  o.lr.total_steps = 5;
  o.executor.weight_slots = 2;
  return o;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> masters, m, v;
  std::vector<float> probe_tensor;    // ReadTensor(kProbeTensor)
  std::vector<float> probe_gradient;  // ReadGradient(kProbeTensor): the last step's
  uint64_t pageable_bytes = 0;
};

inline constexpr char kProbeTensor[] = "model.layers.17.mlp.down_proj.weight";

// Every entry's master, m and v, wherever they live.
inline void ReadStore(const ParameterStore& store, Outcome* out) {
  for (int e = 0; e < store.num_entries(); ++e) {
    const size_t n = store.spec(e).elements;
    out->masters.emplace_back(n);
    out->m.emplace_back(n);
    out->v.emplace_back(n);
    EXPECT_TRUE(store.ReadMaster(e, out->masters.back().data()).ok());
    EXPECT_TRUE(store.ReadOptimizerState(e, out->m.back().data(), out->v.back().data()).ok());
  }
}

inline void ExpectSameState(const Outcome& expected, const Outcome& actual) {
  ASSERT_EQ(expected.masters.size(), actual.masters.size());
  for (size_t e = 0; e < expected.masters.size(); ++e) {
    const size_t bytes = expected.masters[e].size() * sizeof(float);
    EXPECT_EQ(std::memcmp(expected.masters[e].data(), actual.masters[e].data(), bytes), 0) << e;
    EXPECT_EQ(std::memcmp(expected.m[e].data(), actual.m[e].data(), bytes), 0) << e;
    EXPECT_EQ(std::memcmp(expected.v[e].data(), actual.v[e].data(), bytes), 0) << e;
  }
}

// The "offset N" of an I/O error message.
inline uint64_t OffsetIn(const std::string& message) {
  const size_t at = message.find("offset ");
  return at == std::string::npos ? UINT64_MAX : std::stoull(message.substr(at + 7));
}

inline Outcome TrainFiveSteps(const TrainerOptions& o, const TinyShape& shape = DeepNarrow()) {
  Outcome out;
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  (*trainer)->InitializeRandom(3);
  const auto batches = MakeTokenBatches(10, 48, shape.vocab, 17);
  for (int step = 0; step < 5; ++step) {
    auto r =
        (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    out.losses.push_back(r->loss);
    out.pageable_bytes = r->pageable_host_bytes;
  }
  EXPECT_TRUE((*trainer)->UpdateStatus().ok());
  ReadStore((*trainer)->store(), &out);
  auto tensor = (*trainer)->ReadTensor(kProbeTensor);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  if (tensor.ok()) out.probe_tensor = *tensor;
  auto gradient = (*trainer)->ReadGradient(kProbeTensor);
  EXPECT_TRUE(gradient.ok()) << gradient.status();
  if (gradient.ok()) out.probe_gradient = *gradient;
  return out;
}

inline size_t StateBytes(const TrainerOptions& o) {
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  return trainer.ok() ? (*trainer)->store().total_elements() * sizeof(float) * 2 : 0;
}

// BaseOptions with the tiers on: pinned RAM for the copy endpoints (master or
// its fp32 copy, gradients), 1/ram_divisor of the optimizer state's bytes of
// pageable RAM, and twice that state on NVMe (the directory is the caller's).
inline TrainerOptions TieredOptions(size_t ram_divisor) {
  TrainerOptions o = BaseOptions();
  const size_t state_bytes = StateBytes(o);
  o.memory.enabled = true;
  o.memory.budgets.pinned_ram = state_bytes + (size_t{4} << 20);
  o.memory.budgets.ram = state_bytes / ram_divisor;
  o.memory.budgets.nvme_bytes = 2 * state_bytes;
  return o;
}

// Three steps with `first`, a checkpoint (model files as `checkpoint_options`
// says) under `dir`, a fresh trainer with `second` loading it, two more steps:
// bitwise the all-RAM run's losses of steps 4, 5 and its final state. The
// options' NVMe directories are created here.
inline void ExpectBitwiseResume(const std::string& dir, const TrainerOptions& first,
                                const TrainerOptions& second,
                                const CheckpointOptions& checkpoint_options = {}) {
  const Outcome in_ram = TrainFiveSteps(BaseOptions());
  ASSERT_EQ(in_ram.losses.size(), 5u);
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  std::string checkpoint;
  {
    if (!first.memory.budgets.nvme_dir.empty()) {
      std::filesystem::create_directories(first.memory.budgets.nvme_dir);
    }
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), first);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    for (int step = 0; step < 3; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
    }
    auto written =
        WriteCheckpoint(**trainer, dir + "/checkpoints", CheckpointRunInfo{}, checkpoint_options);
    ASSERT_TRUE(written.ok()) << written.status();
    checkpoint = *written;
  }
  if (!second.memory.budgets.nvme_dir.empty()) {
    std::filesystem::create_directories(second.memory.budgets.nvme_dir);
  }
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), second);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto loaded = LoadCheckpoint(checkpoint, **trainer);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (int step = 3; step < 5; ++step) {
    auto r =
        (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::memcmp(&r->loss, &in_ram.losses[step], sizeof(double)), 0) << "step " << step;
  }
  ASSERT_TRUE((*trainer)->UpdateStatus().ok());
  Outcome resumed;
  ReadStore((*trainer)->store(), &resumed);
  ExpectSameState(in_ram, resumed);
}

}  // namespace megatrain::engine::tiered_training
