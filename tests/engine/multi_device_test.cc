// Several CPU devices in one process (docs/scale_out.md "Several devices in one
// process"): N devices with accumulation A (a multiple of N) give bitwise the
// losses, gradient norms, gradients, masters and AdamW moments of one device
// with accumulation A -- whole-stage slots, the fragmented ring, a tied
// embedding, links of different speeds. A failed micro-batch fails the step
// without leaving a device waiting; the NVMe compute copy is refused
// (NVMe gradients: tests/tiers/multi_device_tiers_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  // kDevices: each device sums its micro-batches, a reduce-scatter among them, 1/N out each.
  GradientReduction reduction = GradientReduction::kHost;
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
  o.gradient_reduction = rc.reduction;
  if (rc.reduction != GradientReduction::kHost) {
    o.executor.gradient_accumulation = GradientAccumulation::kAuto;
  }
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
  const bool reduced = rc.devices > 1 && (rc.reduction == GradientReduction::kDevices ||
                                          rc.reduction == GradientReduction::kDeviceShards);
  const bool every_micro_batch = reduced && rc.reduction == GradientReduction::kDeviceShards;
  EXPECT_EQ(t.device_reduction() != nullptr, reduced) << rc.name;
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
  // turn_wait_seconds sums (DeviceFiguresFromSpans); one device takes none. Reduced, only the
  // embedding's rows take turns, and every device joined a reduce-scatter per summed entry.
  for (int d = 0; d < rc.devices; ++d) {
    int turn_waits = 0, reduce_scatters = 0;
    for (const TimelineSpan& span : devices[d]->timeline().Spans()) {
      if (span.kind == SpanKind::kWait && span.label == kGradientTurnWaitLabel) ++turn_waits;
      if (span.stream == "copy_out" && span.label == "reduce-scatter") ++reduce_scatters;
    }
    // The last step's timeline: one per decoder layer, the final norm and the LM head (with
    // device_shards, per micro-batch of the device).
    const int rounds = every_micro_batch ? rc.accumulation / rc.devices : 1;
    EXPECT_EQ(reduce_scatters, reduced ? (Shape(rc.tied).layers + 2) * rounds : 0)
        << rc.name << " device " << d;
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

// GradientReduction::kDevices on the CPU device: with one micro-batch per device, the rank-ordered
// reduce-scatter of the devices' sums makes one device's adds (g0 + g1) + g2, so N devices give
// one device's bits with accumulation N; entries of sizes the world does not divide are padded.
TEST(MultiDeviceTest, ReduceScatterOfOneMicroBatchPerDeviceEqualsOneDevice) {
  ExpectSameAsOneDevice({.name = "reduced, 2 devices, A=2",
                         .devices = 2,
                         .accumulation = 2,
                         .reduction = GradientReduction::kDevices});
  ExpectSameAsOneDevice({.name = "reduced, 3 devices, A=3, slow links",
                         .devices = 3,
                         .accumulation = 3,
                         .throttle_later_devices = true,
                         .reduction = GradientReduction::kDevices});
  // The fragmented head sums block by block and is reduced whole after its last block.
  ExpectSameAsOneDevice({.name = "reduced, ring, 3 devices, A=3",
                         .devices = 3,
                         .accumulation = 3,
                         .weight_ring_bytes = 96 * 1024,
                         .reduction = GradientReduction::kDevices});
}

// GradientReduction::kDeviceShards: every micro-batch's gradient reduce-scattered as it leaves the
// backward, each device keeping only its shard's sum. One micro-batch per device: one device's
// bits again; the device holds 1/N of the sums.
TEST(MultiDeviceTest, ReduceScatterEveryMicroBatchIntoShardSumsEqualsOneDevice) {
  ExpectSameAsOneDevice({.name = "shards, 2 devices, A=2",
                         .devices = 2,
                         .accumulation = 2,
                         .reduction = GradientReduction::kDeviceShards});
  ExpectSameAsOneDevice({.name = "shards, 3 devices, A=3, slow links",
                         .devices = 3,
                         .accumulation = 3,
                         .throttle_later_devices = true,
                         .reduction = GradientReduction::kDeviceShards});
  // Two micro-batches per device: ((g0 + g1) + (g2 + g3)) by rounds, deterministic, within fp32
  // rounding of the turns.
  const RunConfig two_rounds{.name = "shards, 2 devices, A=4",
                             .devices = 2,
                             .accumulation = 4,
                             .reduction = GradientReduction::kDeviceShards};
  const RunResult first = Train(two_rounds);
  ExpectBitwiseEqual(first, Train(two_rounds), "shards twice");
  RunConfig turns = two_rounds;
  turns.reduction = GradientReduction::kHost;
  const RunResult reference = Train(turns);
  for (size_t s = 0; s < reference.losses.size(); ++s) {
    EXPECT_NEAR(first.norms[s], reference.norms[s], 1e-4 * std::abs(reference.norms[s]));
  }
}

TEST(MultiDeviceTest, ShardSumsTakeOneNthOfTheDeviceMemoryOfWholeSums) {
  const TinyShape shape = Shape(false);
  size_t whole = 0, shards = 0;
  for (GradientReduction r : {GradientReduction::kDevices, GradientReduction::kDeviceShards}) {
    auto d0 = MakeCpuDevice(size_t{64} << 20);
    auto d1 = MakeCpuDevice(size_t{64} << 20);
    auto d2 = MakeCpuDevice(size_t{64} << 20);
    RunConfig rc{.name = "memory", .devices = 3, .reduction = r};
    auto trainer =
        Trainer::Create({d0.get(), d1.get(), d2.get()}, TinyConfig(shape), Options(rc));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*trainer)->executor().reduces_every_micro_batch(),
              r == GradientReduction::kDeviceShards);
    (r == GradientReduction::kDevices ? whole : shards) =
        (*trainer)->executor().plan().gradient_sums;
  }
  ASSERT_GT(whole, 0u);
  // A third of the sums (each padded to 256 bytes) and the shard buffer of the largest.
  EXPECT_LT(shards, whole / 2) << whole << " vs " << shards;
}

TEST(MultiDeviceTest, ReduceScatterMovesLessOverEachLinkThanTurns) {
  for (int devices : {2, 3}) {
    RunConfig turns{.name = "turns", .devices = devices, .accumulation = devices};
    RunConfig reduced = turns;
    reduced.name = "reduced";
    reduced.reduction = GradientReduction::kDevices;
    const RunResult by_turns = Train(turns);
    const RunResult by_reduction = Train(reduced);
    ExpectBitwiseEqual(by_reduction, by_turns, "reduced against turns");
    ASSERT_EQ(by_turns.reports.size(), by_reduction.reports.size());
    for (size_t s = 0; s < by_turns.reports.size(); ++s) {
      for (int d = 0; d < devices; ++d) {
        const uint64_t turn_bytes = by_turns.reports[s].devices[d].link_bytes;
        const uint64_t reduced_bytes = by_reduction.reports[s].devices[d].link_bytes;
        // The same weights come in; (N-1)/N of each decoder layer's gradient no longer goes out.
        EXPECT_LT(reduced_bytes, turn_bytes) << devices << " devices, step " << s << " device "
                                             << d;
      }
    }
  }
}

TEST(MultiDeviceTest, ReduceScatterOfSeveralMicroBatchesPerDeviceIsCloseAndRepeatable) {
  // Each device sums its own two micro-batches first: ((g0 + g2) + (g1 + g3)), not one device's
  // (((g0 + g1) + g2) + g3). Deterministic, within fp32 rounding of the turns' bits.
  const RunConfig rc{.name = "reduced, 2 devices, A=4",
                     .devices = 2,
                     .accumulation = 4,
                     .reduction = GradientReduction::kDevices};
  const RunResult first = Train(rc);
  const RunResult again = Train(rc);
  ExpectBitwiseEqual(first, again, "reduced twice");
  RunConfig turns = rc;
  turns.reduction = GradientReduction::kHost;
  const RunResult reference = Train(turns);
  ASSERT_EQ(first.losses.size(), reference.losses.size());
  for (size_t s = 0; s < reference.losses.size(); ++s) {
    EXPECT_NEAR(first.losses[s], reference.losses[s], 1e-5 * std::abs(reference.losses[s]));
    EXPECT_NEAR(first.norms[s], reference.norms[s], 1e-4 * std::abs(reference.norms[s]));
  }
}

TEST(MultiDeviceTest, ReduceScatterRefusesWhatItCannotRunNamingTheField) {
  auto d0 = MakeCpuDevice(size_t{64} << 20);
  auto d1 = MakeCpuDevice(size_t{64} << 20);
  {
    RunConfig rc{.name = "tied", .devices = 2, .tied = true,
                 .reduction = GradientReduction::kDevices};
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(true)), Options(rc));
    ASSERT_FALSE(trainer.ok());
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(trainer.status().message().find("tie_word_embeddings"), std::string::npos)
        << trainer.status();
    // Auto keeps such a job on the host's turns.
    rc.reduction = GradientReduction::kAuto;
    auto automatic = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(true)), Options(rc));
    ASSERT_TRUE(automatic.ok()) << automatic.status();
    EXPECT_EQ((*automatic)->device_reduction(), nullptr);
  }
  {
    RunConfig rc{.name = "host sums", .devices = 2, .reduction = GradientReduction::kDevices};
    TrainerOptions o = Options(rc);
    o.executor.gradient_accumulation = GradientAccumulation::kHost;
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(false)), o);
    ASSERT_FALSE(trainer.ok());
    EXPECT_NE(trainer.status().message().find("gradient_accumulation=host"), std::string::npos)
        << trainer.status();
  }
  {
    RunConfig rc{.name = "nvme", .devices = 2, .reduction = GradientReduction::kDevices};
    TrainerOptions o = Options(rc);
    o.memory.enabled = true;
    o.memory.budgets.nvme_dir = ::testing::TempDir();
    o.memory.budgets.nvme_bytes = uint64_t{1} << 30;
    o.memory.budgets.ram = uint64_t{1} << 30;
    o.memory.budgets.pinned_ram = uint64_t{1} << 30;
    o.memory.grad_on_nvme = true;
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(false)), o);
    ASSERT_FALSE(trainer.ok());
    EXPECT_NE(trainer.status().message().find("memory.grad_on_nvme"), std::string::npos)
        << trainer.status();
  }
  {
    RunConfig rc{.name = "ring", .devices = 2, .weight_ring_bytes = 96 * 1024,
                 .reduction = GradientReduction::kDeviceShards};
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(false)), Options(rc));
    ASSERT_FALSE(trainer.ok());
    EXPECT_NE(trainer.status().message().find("executor.weight_ring_bytes"), std::string::npos)
        << trainer.status();
  }
  {
    // Device shards: every device joins every micro-batch's reduce-scatters.
    RunConfig rc{.name = "uneven", .devices = 2, .reduction = GradientReduction::kDeviceShards};
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(false)), Options(rc));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    auto batches = MakeTokenBatches(3, kMicroBatch * kSeq, Shape(false).vocab, 5);
    auto step = (*trainer)->Step(batches.InputPointers(0, 3), batches.TargetPointers(0, 3));
    ASSERT_FALSE(step.ok());
    EXPECT_NE(step.status().message().find("the same number on every device"), std::string::npos)
        << step.status();
  }
  {
    // A step with fewer micro-batches than devices: a device would never join.
    RunConfig rc{.name = "short", .devices = 2, .reduction = GradientReduction::kDevices};
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(Shape(false)), Options(rc));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    auto batches = MakeTokenBatches(1, kMicroBatch * kSeq, Shape(false).vocab, 5);
    auto step = (*trainer)->Step(batches.InputPointers(0, 1), batches.TargetPointers(0, 1));
    ASSERT_FALSE(step.ok());
    EXPECT_NE(step.status().message().find("at least one micro-batch per device"),
              std::string::npos)
        << step.status();
  }
}

// A step that fails after a device summed one of its micro-batches leaves nothing behind: the
// next step's first micro-batch on that device starts its sums afresh (else the next step's
// gradient would carry the failed step's micro-batch).
void ExpectAFailedStepLeavesNoSumsBehind(GradientReduction reduction) {
  const TinyShape shape = Shape(false);
  RunConfig rc{.name = "failing", .devices = 2, .reduction = reduction};
  auto batches = MakeTokenBatches(8, kMicroBatch * kSeq, shape.vocab, 5);
  std::vector<StepReport> after_failure, fresh;
  for (bool fail_first : {true, false}) {
    auto d0 = MakeCpuDevice(size_t{64} << 20);
    auto d1 = MakeCpuDevice(size_t{64} << 20);
    auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(shape), Options(rc));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    if (fail_first) {
      // Micro-batch 3 is device 1's second: its first (micro-batch 1) was summed.
      const int32_t saved = batches.inputs[3][7];
      batches.inputs[3][7] = shape.vocab + 4;
      auto failed = (*trainer)->Step(batches.InputPointers(0, 4), batches.TargetPointers(0, 4));
      batches.inputs[3][7] = saved;
      ASSERT_FALSE(failed.ok());
      EXPECT_NE(failed.status().message().find("micro-batch 3 on device 1"), std::string::npos)
          << failed.status();
    }
    auto next = (*trainer)->Step(batches.InputPointers(4, 4), batches.TargetPointers(4, 4));
    ASSERT_TRUE(next.ok()) << next.status();
    (fail_first ? after_failure : fresh).push_back(*next);
  }
  EXPECT_EQ(std::memcmp(&after_failure[0].loss, &fresh[0].loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&after_failure[0].grad_norm, &fresh[0].grad_norm, sizeof(double)), 0)
      << after_failure[0].grad_norm << " vs " << fresh[0].grad_norm;
}

TEST(MultiDeviceTest, AFailedReducedStepLeavesNoSumsBehind) {
  ExpectAFailedStepLeavesNoSumsBehind(GradientReduction::kDevices);
  ExpectAFailedStepLeavesNoSumsBehind(GradientReduction::kDeviceShards);
}

TEST(MultiDeviceTest, ReduceScatterRefusesGradientsThePlacementPutsOnNvme) {
  auto d0 = MakeCpuDevice(size_t{64} << 20);
  auto d1 = MakeCpuDevice(size_t{64} << 20);
  // Layers of 256 Ki floats (1 MiB of gradient each), several NVMe chunks each.
  TinyShape wide;
  wide.layers = 3;
  wide.hidden = 192;
  wide.ffn = 512;
  wide.heads = 6;
  wide.kv_heads = 2;
  RunConfig rc{.name = "tight RAM", .devices = 2, .reduction = GradientReduction::kDevices};
  TrainerOptions o = Options(rc);
  o.memory.enabled = true;
  o.memory.budgets.nvme_dir = ::testing::TempDir();
  o.memory.budgets.nvme_bytes = uint64_t{1} << 30;
  o.memory.nvme_chunk_bytes = 256 << 10;
  o.memory.states_on_nvme = true;
  // Pinned RAM for the master (the CPU device's copy source) and the executors' staging, RAM for
  // the NVMe staging: the 4.6 MiB of gradients fit neither, so the placement moves them to NVMe
  // unasked.
  o.memory.budgets.pinned_ram = 12 << 20;
  o.memory.budgets.ram = 6 << 20;
  auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(wide), o);
  ASSERT_FALSE(trainer.ok()) << (*trainer)->placement_table();
  EXPECT_NE(trainer.status().message().find("the memory placement puts the gradients on NVMe"),
            std::string::npos)
      << trainer.status();
  // Auto (host turns on the CPU device anyway) trains there.
  o.gradient_reduction = GradientReduction::kAuto;
  auto automatic = Trainer::Create({d0.get(), d1.get()}, TinyConfig(wide), o);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_NE((*automatic)->placement_table().find("grad          nvme"), std::string::npos)
      << (*automatic)->placement_table();
}

// Micro-batch `bad` of a step of `accumulation` on 2 devices is refused before it runs: the step
// fails naming it and its device (not a micro-batch the abort released), no device is left
// waiting for it (in a gradient turn or a reduce-scatter), and the next step runs.
void ExpectAFailedMicroBatchFailsOnlyItsStep(const RunConfig& rc, int accumulation, int bad) {
  auto d0 = MakeCpuDevice(size_t{64} << 20);
  auto d1 = MakeCpuDevice(size_t{64} << 20);
  const TinyShape shape = Shape(false);
  auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(shape), Options(rc));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  auto batches = MakeTokenBatches(accumulation, kMicroBatch * kSeq, shape.vocab, 5);
  batches.inputs[bad][7] = shape.vocab + 4;
  auto failed = (*trainer)->Step(batches.InputPointers(0, accumulation),
                                 batches.TargetPointers(0, accumulation));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find(
                absl::StrCat("micro-batch ", bad, " on device ", bad % 2)),
            std::string::npos)
      << rc.name << ": " << failed.status();
  EXPECT_NE(failed.status().message().find("outside the vocabulary"), std::string::npos)
      << rc.name << ": " << failed.status();
  batches.inputs[bad][7] = 1;
  auto next = (*trainer)->Step(batches.InputPointers(0, accumulation),
                               batches.TargetPointers(0, accumulation));
  ASSERT_TRUE(next.ok()) << rc.name << ": " << next.status();
  EXPECT_EQ(next->devices.size(), 2u);
}

TEST(MultiDeviceTest, FailedMicroBatchFailsTheStepAndTheNextStepRuns) {
  ExpectAFailedMicroBatchFailsOnlyItsStep({.name = "turns", .devices = 2}, 4, 2);
  // Device 0 would wait for device 1 in a reduce-scatter it never joins.
  ExpectAFailedMicroBatchFailsOnlyItsStep(
      {.name = "reduced", .devices = 2, .reduction = GradientReduction::kDevices}, 2, 1);
  ExpectAFailedMicroBatchFailsOnlyItsStep(
      {.name = "shards", .devices = 2, .reduction = GradientReduction::kDeviceShards}, 4, 3);
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
