// The speculative update (TrainerOptions::speculative_update) against the normal one: losses,
// gradient norms, masters, m and v are bitwise the same whether clipping never triggers (every
// speculation committed), triggers on some steps only (committed and discarded steps), or a step
// is non-finite (discarded, nothing updated), and one that can no longer commit stops early; a
// checkpoint taken after committed speculations resumes bitwise; placements with gradients or the
// compute copy on NVMe too agree; a placement that cannot speculate says why and trains as before;
// an I/O error in a speculative write fails the step naming the state file and an offset. The RAM
// form (the master, m and v in RAM, alternate arrays swapped in on commit) is held to the same
// bits: committed, clipped, stopped and non-finite steps, two devices, a pageable master, no
// budgets at all, a resume, and a checkpoint written while the next step speculates; the store
// swaps its alternates by pointer and restores a compute copy from the master. The mixed form (the
// master in RAM, m and v on NVMe: alternate regions for m and v, an alternate array for the master)
// is held to the same bits: committed steps with one and three micro-batches, clipped and stopped
// steps on one and two devices, a non-finite step, a pageable master, gradients on NVMe, and a
// checkpoint between speculating steps resumed. The previous-norm clip rule's speculation, run
// with its planned coefficient, commits on clipped steps where the plan holds, bitwise, and the
// previous norm survives a checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/async_checkpoint_writer.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/tiers/fault_injecting_block_io.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "engine/train/trainer.h"
#include "kernels/common/bf16.h"
#include "tests/tiers/tiered_training.h"

namespace megatrain::engine {
namespace {

using namespace tiered_training;  // NOLINT: the shared fixtures of this folder

// Three chunks per decoder layer of DeepNarrow (about 185 Ki elements), the last one short.
constexpr size_t kSmallChunk = size_t{256} << 10;

// The master, m and v on NVMe (the CPU device computes from a pinned fp32 copy), gradients in
// pinned RAM, and NVMe room for the alternate regions.
TrainerOptions MasterOnNvme(const std::string& dir, double grad_clip, bool speculate) {
  TrainerOptions o = TieredOptions(1);
  o.memory.master_on_nvme = true;
  o.memory.nvme_chunk_bytes = kSmallChunk;
  o.memory.budgets.nvme_dir = dir;
  o.memory.budgets.nvme_bytes *= 4;  // master, m, v (1.5x m and v) twice
  o.grad_clip = grad_clip;
  o.speculative_update = speculate;
  return o;
}

// The master (pinned: the CPU device's copy endpoint), m and v in RAM, with pinned and RAM room
// for their alternates (the master's pinned, m's and v's pageable) beside the gradients.
TrainerOptions StateInRam(double grad_clip, bool speculate) {
  TrainerOptions o = BaseOptions();
  const size_t m_and_v = StateBytes(o);
  o.memory.enabled = true;
  o.memory.budgets.pinned_ram = 2 * m_and_v + (size_t{4} << 20);  // grad, master, master again
  o.memory.budgets.ram = 2 * m_and_v + (size_t{4} << 20);         // m and v twice
  o.grad_clip = grad_clip;
  o.speculative_update = speculate;
  return o;
}

// The mixed form: the master in RAM (pinned, the CPU device's copy endpoint, with pinned room
// for its alternate array), m and v on NVMe (room for their alternate regions), gradients in
// pinned RAM.
TrainerOptions MasterInRam(const std::string& dir, double grad_clip, bool speculate) {
  TrainerOptions o = MasterOnNvme(dir, grad_clip, speculate);
  o.memory.master_on_nvme = false;
  o.memory.states_on_nvme = true;
  o.memory.budgets.pinned_ram += o.memory.budgets.pinned_ram / 2;  // grad, master, master again
  return o;
}

struct TrainedRun {
  Outcome outcome;
  std::vector<StepReport> reports;
  std::string placement_table;
  int num_entries = 0;
};

// `steps` steps of `micro_batches` micro-batches on `devices` CPU devices (micro-batch m on
// device m % devices); before_step(trainer, s) runs before step s (0-based).
TrainedRun Train(const TrainerOptions& o, int steps,
                 const std::function<void(Trainer&, int)>& before_step = nullptr,
                 int devices = 1, int micro_batches = 2, double later_latency_us = 0) {
  TrainedRun run;
  if (!o.memory.budgets.nvme_dir.empty()) {
    std::filesystem::create_directories(o.memory.budgets.nvme_dir);
  }
  const CpuDevices owned = MakeCpuDevices(devices, size_t{32} << 20, later_latency_us);
  auto trainer = Trainer::Create(owned.pointers, TinyConfig(DeepNarrow()), o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return run;
  run.placement_table = (*trainer)->placement_table();
  run.num_entries = (*trainer)->store().num_entries();
  (*trainer)->InitializeRandom(3);
  const auto batches =
      MakeTokenBatches(std::max(10, steps * micro_batches), 48, DeepNarrow().vocab, 17);
  for (int step = 0; step < steps; ++step) {
    if (before_step) before_step(**trainer, step);
    const int first = micro_batches * step;
    auto r = (*trainer)->Step(batches.InputPointers(first, micro_batches),
                              batches.TargetPointers(first, micro_batches));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return run;
    run.outcome.losses.push_back(r->loss);
    run.reports.push_back(*r);
  }
  EXPECT_TRUE((*trainer)->UpdateStatus().ok());
  ReadStore((*trainer)->store(), &run.outcome);
  return run;
}

// Losses, gradient norms, clip coefficients, skips, masters, m and v: bit for bit.
void ExpectBitwise(const TrainedRun& normal, const TrainedRun& speculative) {
  ASSERT_EQ(normal.reports.size(), speculative.reports.size());
  for (size_t s = 0; s < normal.reports.size(); ++s) {
    const StepReport& a = normal.reports[s];
    const StepReport& b = speculative.reports[s];
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << "step " << s;
    EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0) << "step " << s;
    EXPECT_EQ(std::memcmp(&a.clip_coefficient, &b.clip_coefficient, sizeof(double)), 0) << s;
    EXPECT_EQ(a.skipped, b.skipped) << "step " << s;
  }
  ExpectSameState(normal.outcome, speculative.outcome);
}

std::string FreshDir(const std::string& name) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir(name, &usable);
  return usable.ok() ? dir : "";
}

// A clip between the smallest and largest gradient norms of 5 unclipped steps, so clipping
// triggers on some steps only; 0 (after a failed expectation) when the norms are all equal.
double ClipBetweenUnclippedNorms(const std::string& dir) {
  const TrainedRun unclipped =
      Train(dir.empty() ? StateInRam(0.0, false) : MasterOnNvme(dir, 0.0, false), 5);
  EXPECT_EQ(unclipped.reports.size(), 5u);
  if (unclipped.reports.empty()) return 0.0;
  double low = unclipped.reports[0].grad_norm, high = low;
  for (const StepReport& r : unclipped.reports) {
    low = std::min(low, r.grad_norm);
    high = std::max(high, r.grad_norm);
  }
  EXPECT_LT(low, high);
  return low < high ? std::sqrt(low * high) : 0.0;
}

TEST(SpeculativeUpdateTest, WithoutClippingEverySpeculationCommitsBitwise) {
  const std::string dir = FreshDir("speculative_no_clip");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  // grad_clip 0 (off), and a clip no norm of this run reaches: the coefficient is exactly 1.
  for (double clip : {0.0, 1e6}) {
    SCOPED_TRACE(clip);
    const TrainedRun normal = Train(MasterOnNvme(dir, clip, false), 5);
    const TrainedRun speculative = Train(MasterOnNvme(dir, clip, true), 5);
    ASSERT_EQ(speculative.reports.size(), 5u);
    EXPECT_NE(speculative.placement_table.find("speculative update on"), std::string::npos)
        << speculative.placement_table;
    for (const StepReport& r : speculative.reports) {
      EXPECT_EQ(r.clip_coefficient, 1.0) << r.step;
      EXPECT_TRUE(r.speculation_committed) << r.step;
      EXPECT_EQ(r.speculated_entries, speculative.num_entries) << r.step;
    }
    for (const StepReport& r : normal.reports) {
      EXPECT_EQ(r.speculated_entries, 0);
      EXPECT_FALSE(r.speculation_committed);
    }
    ExpectBitwise(normal, speculative);
  }
}

TEST(SpeculativeUpdateTest, ClippingOnSomeStepsCommitsTheOthersAndDiscardsThose) {
  const std::string dir = FreshDir("speculative_some_clip");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  // A clip between the run's smallest and largest unclipped norms.
  const double clip = ClipBetweenUnclippedNorms(dir);
  ASSERT_GT(clip, 0.0);
  const TrainedRun normal = Train(MasterOnNvme(dir, clip, false), 5);
  const TrainedRun speculative = Train(MasterOnNvme(dir, clip, true), 5);
  ASSERT_EQ(speculative.reports.size(), 5u);
  int committed = 0, discarded = 0;
  for (const StepReport& r : speculative.reports) {
    EXPECT_EQ(r.speculation_committed, r.clip_coefficient == 1.0) << r.step;
    // A clipped step's speculation stops once the norm of the gradients final so far clips.
    if (r.speculation_committed) {
      EXPECT_EQ(r.speculated_entries, speculative.num_entries) << r.step;
    } else {
      EXPECT_LT(r.speculated_entries, speculative.num_entries) << r.step;
    }
    (r.speculation_committed ? committed : discarded) += 1;
  }
  EXPECT_GT(committed, 0) << "clip " << clip;
  EXPECT_GT(discarded, 0) << "clip " << clip;
  ExpectBitwise(normal, speculative);
}

// Two devices (one micro-batch each) with speculation, against one device without: both commits
// and discards (a clip between the unclipped steps' norms) and every bit match. `reduction`:
// where the devices' gradients meet; `later_latency_us`: device 1's copies come that late.
void ExpectTwoDevicesSpeculateLikeOne(const std::string& name, GradientReduction reduction,
                                      double later_latency_us) {
  const std::string dir = FreshDir(name);
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  const double clip = ClipBetweenUnclippedNorms(dir);
  ASSERT_GT(clip, 0.0);
  const TrainedRun normal = Train(MasterOnNvme(dir, clip, false), 5);
  TrainerOptions o = MasterOnNvme(dir, clip, true);
  o.gradient_reduction = reduction;
  if (reduction != GradientReduction::kHost) {
    o.executor.gradient_accumulation = GradientAccumulation::kAuto;
  }
  const TrainedRun two =
      Train(o, 5, nullptr, /*devices=*/2, /*micro_batches=*/2, later_latency_us);
  ASSERT_EQ(two.reports.size(), 5u);
  int committed = 0, discarded = 0;
  for (const StepReport& r : two.reports) {
    EXPECT_EQ(r.speculation_committed, r.clip_coefficient == 1.0) << r.step;
    (r.speculation_committed ? committed : discarded) += 1;
  }
  EXPECT_GT(committed, 0) << "clip " << clip;
  EXPECT_GT(discarded, 0) << "clip " << clip;
  ExpectBitwise(normal, two);
}

// The last micro-batch's gradients are final once its turn has landed, after the other
// device's.
TEST(SpeculativeUpdateTest, TwoDevicesSpeculateBitwiseLikeOneDeviceWithout) {
  ExpectTwoDevicesSpeculateLikeOne("speculative_two_devices", GradientReduction::kHost, 0);
}

// Devices that reduce-scatter their sums (gradient_reduction=devices): an entry is final once
// every device's shard has landed, which the step learns from each device's last micro-batch.
// One micro-batch per device is bitwise one device's accumulation. Device 1's copies come 20 ms
// late, so an entry taken as final at device 0's shard alone would be read without device 1's.
TEST(SpeculativeUpdateTest, TwoDevicesReducingOnTheDevicesSpeculateBitwiseLikeOneDeviceWithout) {
  ExpectTwoDevicesSpeculateLikeOne("speculative_two_devices_reduced",
                                   GradientReduction::kDevices, 20000);
  ExpectTwoDevicesSpeculateLikeOne("speculative_two_devices_shards",
                                   GradientReduction::kDeviceShards, 20000);
}

TEST(SpeculativeUpdateTest, ASpeculationThatCannotCommitStopsEarly) {
  const std::string dir = FreshDir("speculative_stop");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  // A clip below any single entry's gradient norm: every step clips, and its speculation stops
  // at the first entry whose gradient is final, before updating it.
  const TrainedRun normal = Train(MasterOnNvme(dir, 1e-9, false), 3);
  const TrainedRun speculative = Train(MasterOnNvme(dir, 1e-9, true), 3);
  ASSERT_EQ(speculative.reports.size(), 3u);
  for (const StepReport& r : speculative.reports) {
    EXPECT_LT(r.clip_coefficient, 1.0) << r.step;
    EXPECT_EQ(r.speculated_entries, 0) << r.step;
    EXPECT_FALSE(r.speculation_committed) << r.step;
  }
  ExpectBitwise(normal, speculative);
}

TEST(SpeculativeUpdateTest, ANonFiniteStepDiscardsTheSpeculationAndUpdatesNothing) {
  const std::string dir = FreshDir("speculative_non_finite");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  // Before step 3 one weight of layer 5 becomes +inf (its gradients turn non-finite: the step
  // is skipped); before step 4 it is put back. The speculation of step 3 wrote the compute copy
  // of every entry it updated: discarding it must restore those.
  std::vector<float> saved;
  const auto poison = [&saved](Trainer& t, int step) {
    const int e = t.layout().layer_entry(5);
    ASSERT_TRUE(t.UpdateStatus().ok());
    if (step == 2) {
      saved.assign(t.store().spec(e).elements, 0.0f);
      ASSERT_TRUE(t.store().ReadMaster(e, saved.data()).ok());
      std::vector<float> bad = saved;
      bad[7] = std::numeric_limits<float>::infinity();
      ASSERT_TRUE(t.mutable_store().WriteMaster(e, bad.data()).ok());
    } else if (step == 3) {
      ASSERT_TRUE(t.mutable_store().WriteMaster(e, saved.data()).ok());
    }
  };
  const TrainedRun normal = Train(MasterOnNvme(dir, 0.0, false), 5, poison);
  const TrainedRun speculative = Train(MasterOnNvme(dir, 0.0, true), 5, poison);
  ASSERT_EQ(speculative.reports.size(), 5u);
  EXPECT_TRUE(speculative.reports[2].skipped);
  EXPECT_GT(speculative.reports[2].speculated_entries, 0);
  EXPECT_FALSE(speculative.reports[2].speculation_committed);
  for (int s : {0, 1, 3, 4}) {
    EXPECT_FALSE(speculative.reports[s].skipped) << s;
    EXPECT_TRUE(speculative.reports[s].speculation_committed) << s;
  }
  ExpectBitwise(normal, speculative);
}

TEST(SpeculativeUpdateTest, ACheckpointAfterCommittedSpeculationsResumesBitwise) {
  const std::string dir = FreshDir("speculative_resume");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  const TrainedRun uninterrupted = Train(MasterOnNvme(dir + "/whole", 0.0, false), 5);
  ASSERT_EQ(uninterrupted.reports.size(), 5u);
  // Three committed steps: every unit's current state is in its alternate region now, which
  // the checkpoint must read.
  std::string checkpoint;
  {
    const TrainerOptions o = MasterOnNvme(dir + "/first", 0.0, true);
    std::filesystem::create_directories(o.memory.budgets.nvme_dir);
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
    for (int step = 0; step < 3; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->speculation_committed);
      EXPECT_EQ(std::memcmp(&r->loss, &uninterrupted.reports[step].loss, sizeof(double)), 0);
    }
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    EXPECT_EQ((*trainer)->store().state_store()->current_region(0), 1);
    auto written = WriteCheckpoint(**trainer, dir + "/checkpoints", CheckpointRunInfo{});
    ASSERT_TRUE(written.ok()) << written.status();
    checkpoint = *written;
  }
  // Resumed with and without speculation: the same bits as the uninterrupted run.
  for (bool speculate : {true, false}) {
    SCOPED_TRACE(speculate);
    const TrainerOptions o = MasterOnNvme(dir + "/second", 0.0, speculate);
    std::filesystem::create_directories(o.memory.budgets.nvme_dir);
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto loaded = LoadCheckpoint(checkpoint, **trainer);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
    for (int step = 3; step < 5; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(std::memcmp(&r->loss, &uninterrupted.reports[step].loss, sizeof(double)), 0)
          << "step " << step;
      EXPECT_EQ(r->speculation_committed, speculate);
    }
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    Outcome resumed;
    ReadStore((*trainer)->store(), &resumed);
    ExpectSameState(uninterrupted.outcome, resumed);
  }
}

TEST(SpeculativeUpdateTest, MixedPlacementsAreBitwise) {
  const std::string dir = FreshDir("speculative_mixed");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  // Gradients and the compute copy on NVMe too, but the embedding's (in RAM), in chunks of two
  // sizes; the master in RAM with m and v on NVMe (the mixed form); and
  // the master on NVMe with weights through a fragment ring smaller than a layer (the head's
  // gradient goes out block by block).
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    TrainerOptions normal = MasterOnNvme(dir, 0.0, false);
    if (variant == 3) {
      normal.executor.weight_ring_bytes = size_t{600} << 10;
      normal.executor.fragment_bytes = size_t{40} << 10;
    } else if (variant < 2) {
      normal.memory.grad_on_nvme = true;
      normal.memory.compute_copy_on_nvme = true;
      normal.memory.budgets.nvme_bytes *= 2;
      normal.memory.nvme_chunk_bytes = variant == 0 ? kSmallChunk : 3 * kSmallChunk;
    } else {
      normal = MasterInRam(dir, 0.0, false);
    }
    TrainerOptions speculative = normal;
    speculative.speculative_update = true;
    const TrainedRun a = Train(normal, 4);
    const TrainedRun b = Train(speculative, 4);
    ASSERT_EQ(b.reports.size(), 4u);
    for (const StepReport& r : b.reports) EXPECT_TRUE(r.speculation_committed) << r.step;
    ExpectBitwise(a, b);
  }
}

TEST(SpeculativeUpdateTest, WithoutNvmeRoomForTheAlternateRegionsItIsOffAndSaysSo) {
  const std::string dir = FreshDir("speculative_no_room");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  TrainerOptions o = MasterOnNvme(dir, 0.0, true);
  o.memory.budgets.nvme_bytes /= 4;  // m and v twice: the master fits, a second copy does not
  const TrainedRun run = Train(o, 2);
  ASSERT_EQ(run.reports.size(), 2u);
  EXPECT_NE(run.placement_table.find("speculative update off: its alternate master/m/v regions "
                                     "need"),
            std::string::npos)
      << run.placement_table;
  for (const StepReport& r : run.reports) EXPECT_EQ(r.speculated_entries, 0);
}

TEST(SpeculativeUpdateTest, AWriteErrorInTheSpeculationFailsTheStepNamingFileAndOffset) {
  const std::string dir = FreshDir("speculative_fault");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  auto io = tiers::UringBlockIo::Create();
  if (!io.ok()) GTEST_SKIP() << "io_uring unavailable: " << io.status();
  tiers::FaultInjectingBlockIo faults(**io);
  TrainerOptions o = MasterOnNvme(dir, 0.0, true);
  o.memory.block_io_for_tests = &faults;
  auto device = MakeCpuDevice(size_t{32} << 20);
  auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  auto first = (*trainer)->Step(batches.InputPointers(0, 2), batches.TargetPointers(0, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*trainer)->UpdateStatus().ok());
  // Step 1 committed, so its pass wrote nothing: the next writes of the state file are step 2's
  // speculative ones.
  const std::string state_file = (*trainer)->store().state_store()->path();
  faults.FailNthOfFile(tiers::IoOp::kWrite, state_file, 3, tiers::InjectedFault::kEio);
  auto second = (*trainer)->Step(batches.InputPointers(2, 2), batches.TargetPointers(2, 2));
  ASSERT_FALSE(second.ok());
  const std::string message(second.status().message());
  EXPECT_NE(message.find("speculative optimizer update of step 2 failed"), std::string::npos)
      << message;
  EXPECT_NE(message.find(state_file), std::string::npos) << message;
  EXPECT_NE(OffsetIn(message), UINT64_MAX) << message;
}

// The previous-norm clip rule (TrainerOptions::grad_clip_rule): with a clip far below every
// norm each step clips; from step 2 on the coefficient planned from the previous norm is applied
// while it keeps the applied gradient within the clip, and then the speculation, run with it,
// commits. Bitwise against the same rule without speculation, in the NVMe and RAM forms.
TrainerOptions WithPreviousNormRule(TrainerOptions o, double headroom) {
  o.grad_clip_rule = GradClipRule::kPreviousNorm;
  o.grad_clip_headroom = headroom;
  return o;
}

TEST(SpeculativePreviousNormTest, ClippedStepsCommitWhileThePlanHoldsBitwise) {
  const std::string dir = FreshDir("speculative_previous_norm");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  const TrainedRun unclipped = Train(StateInRam(0.0, false), 5);
  ASSERT_EQ(unclipped.reports.size(), 5u);
  double lowest = unclipped.reports[0].grad_norm;
  for (const StepReport& r : unclipped.reports) lowest = std::min(lowest, r.grad_norm);
  const double clip = lowest / 10;
  for (bool in_ram : {false, true}) {
    SCOPED_TRACE(in_ram);
    // Headroom 4: the plan holds unless a norm grows four-fold from one step to the next.
    const auto options = [&](bool speculate) {
      return WithPreviousNormRule(
          in_ram ? StateInRam(clip, speculate) : MasterOnNvme(dir, clip, speculate), 4.0);
    };
    const TrainedRun normal = Train(options(false), 5);
    const TrainedRun speculative = Train(options(true), 5);
    ASSERT_EQ(speculative.reports.size(), 5u);
    int committed = 0;
    for (const StepReport& r : speculative.reports) {
      // Step 1 has no previous norm: the exact coefficient, the speculation discarded.
      if (r.step == 1) {
        EXPECT_EQ(r.planned_clip_coefficient, 0.0);
      }
      EXPECT_LT(r.clip_coefficient, 1.0) << r.step;
      EXPECT_LE(r.clip_coefficient * r.grad_norm, clip) << r.step;
      const bool plan_applied =
          r.planned_clip_coefficient > 0 && r.clip_coefficient == r.planned_clip_coefficient;
      EXPECT_EQ(r.speculation_committed, plan_applied) << r.step;
      if (r.speculation_committed) {
        EXPECT_EQ(r.speculated_entries, speculative.num_entries) << r.step;
        ++committed;
      }
    }
    EXPECT_GE(committed, 3) << "clip " << clip;
    ExpectBitwise(normal, speculative);
  }
}

// The previous norm is part of the optimizer's position: a run checkpointed after step 3 and
// resumed (with and without speculation) plans step 4 as the uninterrupted run did, bit for bit.
TEST(SpeculativePreviousNormTest, ACheckpointKeepsThePreviousNormAndResumesBitwise) {
  const TrainedRun unclipped = Train(StateInRam(0.0, false), 1);
  ASSERT_EQ(unclipped.reports.size(), 1u);
  const double clip = unclipped.reports[0].grad_norm / 10;
  const TrainedRun uninterrupted = Train(WithPreviousNormRule(StateInRam(clip, false), 4.0), 5);
  ASSERT_EQ(uninterrupted.reports.size(), 5u);
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr) << "run under bazel test";
  const std::string root = std::string(tmp) + "/previous_norm_ckpt";
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  std::string checkpoint;
  {
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()),
                                   WithPreviousNormRule(StateInRam(clip, false), 4.0));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    for (int step = 0; step < 3; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
    }
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    auto written = WriteCheckpoint(**trainer, root, CheckpointRunInfo{});
    ASSERT_TRUE(written.ok()) << written.status();
    checkpoint = *written;
  }
  for (bool speculate : {false, true}) {
    SCOPED_TRACE(speculate);
    int committed = 0;
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()),
                                   WithPreviousNormRule(StateInRam(clip, speculate), 4.0));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto loaded = LoadCheckpoint(checkpoint, **trainer);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    for (int step = 3; step < 5; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      const StepReport& want = uninterrupted.reports[step];
      EXPECT_GT(r->planned_clip_coefficient, 0.0) << "step " << step;
      EXPECT_EQ(
          std::memcmp(&r->planned_clip_coefficient, &want.planned_clip_coefficient, sizeof(double)),
          0)
          << "step " << step;
      EXPECT_EQ(std::memcmp(&r->clip_coefficient, &want.clip_coefficient, sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(&r->loss, &want.loss, sizeof(double)), 0) << "step " << step;
      EXPECT_EQ(r->speculation_committed,
                speculate && r->clip_coefficient == r->planned_clip_coefficient)
          << "step " << step;
      committed += r->speculation_committed ? 1 : 0;
    }
    if (speculate) {
      EXPECT_GT(committed, 0) << "the resumed run's plan never committed";
    }
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    Outcome resumed;
    ReadStore((*trainer)->store(), &resumed);
    ExpectSameState(uninterrupted.outcome, resumed);
  }
}

TEST(SpeculativePreviousNormTest, NeedsAClipAndAHeadroomOfAtLeastOne) {
  auto device = MakeCpuDevice(size_t{32} << 20);
  TrainerOptions no_clip = WithPreviousNormRule(StateInRam(0.0, false), 1.25);
  auto refused = Trainer::Create(*device, TinyConfig(DeepNarrow()), no_clip);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("grad_clip_rule=previous_norm needs a clip"),
            std::string::npos)
      << refused.status();
  refused = Trainer::Create(*device, TinyConfig(DeepNarrow()),
                            WithPreviousNormRule(StateInRam(1.0, false), 0.5));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("grad_clip_headroom=0.5 must be finite and >= 1"),
            std::string::npos)
      << refused.status();
}

// The RAM form. Every speculation commits without clipping: the alternates are swapped in, and
// losses, norms, masters, m and v are those of the normal update; the table says it is on.
TEST(SpeculativeRamUpdateTest, WithoutClippingEverySpeculationCommitsBitwise) {
  for (double clip : {0.0, 1e6}) {
    SCOPED_TRACE(clip);
    const TrainedRun normal = Train(StateInRam(clip, false), 5);
    const TrainedRun speculative = Train(StateInRam(clip, true), 5);
    ASSERT_EQ(speculative.reports.size(), 5u);
    EXPECT_NE(speculative.placement_table.find("speculative update on: alternate master/m/v "
                                               "arrays"),
              std::string::npos)
        << speculative.placement_table;
    for (const StepReport& r : speculative.reports) {
      EXPECT_EQ(r.clip_coefficient, 1.0) << r.step;
      EXPECT_TRUE(r.speculation_committed) << r.step;
      EXPECT_EQ(r.speculated_entries, speculative.num_entries) << r.step;
      EXPECT_EQ(r.nvme_bytes_written, 0u) << r.step;
    }
    ExpectBitwise(normal, speculative);
  }
}

// Committed and discarded steps (a clip between the run's norms), one device and two.
TEST(SpeculativeRamUpdateTest, ClippingOnSomeStepsCommitsTheOthersAndDiscardsThose) {
  const double clip = ClipBetweenUnclippedNorms("");
  ASSERT_GT(clip, 0.0);
  const TrainedRun normal = Train(StateInRam(clip, false), 5);
  for (int devices : {1, 2}) {
    SCOPED_TRACE(devices);
    const TrainedRun speculative = Train(StateInRam(clip, true), 5, nullptr, devices);
    ASSERT_EQ(speculative.reports.size(), 5u);
    int committed = 0, discarded = 0;
    for (const StepReport& r : speculative.reports) {
      EXPECT_EQ(r.speculation_committed, r.clip_coefficient == 1.0) << r.step;
      EXPECT_GT(r.speculated_entries + (r.speculation_committed ? 0 : 1), 0) << r.step;
      (r.speculation_committed ? committed : discarded) += 1;
    }
    EXPECT_GT(committed, 0) << "clip " << clip;
    EXPECT_GT(discarded, 0) << "clip " << clip;
    ExpectBitwise(normal, speculative);
  }
}

TEST(SpeculativeRamUpdateTest, ASpeculationThatCannotCommitStopsEarly) {
  const TrainedRun normal = Train(StateInRam(1e-9, false), 3);
  const TrainedRun speculative = Train(StateInRam(1e-9, true), 3);
  ASSERT_EQ(speculative.reports.size(), 3u);
  for (const StepReport& r : speculative.reports) {
    EXPECT_EQ(r.speculated_entries, 0) << r.step;
    EXPECT_FALSE(r.speculation_committed) << r.step;
  }
  ExpectBitwise(normal, speculative);
}

// A non-finite step: the speculation wrote alternates of every entry it reached; none is
// swapped in, and the weights the next step streams are the untouched masters.
TEST(SpeculativeRamUpdateTest, ANonFiniteStepDiscardsTheSpeculationAndUpdatesNothing) {
  std::vector<float> saved;
  const auto poison = [&saved](Trainer& t, int step) {
    const int e = t.layout().layer_entry(5);
    ASSERT_TRUE(t.UpdateStatus().ok());
    if (step == 2) {
      saved.assign(t.store().spec(e).elements, 0.0f);
      ASSERT_TRUE(t.store().ReadMaster(e, saved.data()).ok());
      std::vector<float> bad = saved;
      bad[7] = std::numeric_limits<float>::infinity();
      ASSERT_TRUE(t.mutable_store().WriteMaster(e, bad.data()).ok());
    } else if (step == 3) {
      ASSERT_TRUE(t.mutable_store().WriteMaster(e, saved.data()).ok());
    }
  };
  const TrainedRun normal = Train(StateInRam(0.0, false), 5, poison);
  const TrainedRun speculative = Train(StateInRam(0.0, true), 5, poison);
  ASSERT_EQ(speculative.reports.size(), 5u);
  EXPECT_TRUE(speculative.reports[2].skipped);
  EXPECT_GT(speculative.reports[2].speculated_entries, 0);
  EXPECT_FALSE(speculative.reports[2].speculation_committed);
  for (int s : {0, 1, 3, 4}) EXPECT_TRUE(speculative.reports[s].speculation_committed) << s;
  ExpectBitwise(normal, speculative);
}

// Any mix of pinned and pageable: the master pageable (the pinned budget holds the gradients
// only), and no budgets at all (everything in RAM, nothing to count against).
TEST(SpeculativeRamUpdateTest, APageableMasterAndNoBudgetsAreBitwise) {
  TrainerOptions pageable = StateInRam(0.0, true);
  pageable.memory.budgets.pinned_ram = StateBytes(BaseOptions()) / 2 + (size_t{1} << 20);
  pageable.memory.budgets.ram = 4 * StateBytes(BaseOptions());
  TrainerOptions unbudgeted = BaseOptions();
  unbudgeted.speculative_update = true;
  unbudgeted.grad_clip = 0.0;
  const TrainedRun normal = Train(StateInRam(0.0, false), 4);
  for (const TrainerOptions& o : {pageable, unbudgeted}) {
    SCOPED_TRACE(o.memory.enabled);
    const TrainedRun speculative = Train(o, 4);
    ASSERT_EQ(speculative.reports.size(), 4u);
    if (o.memory.enabled) {
      EXPECT_NE(speculative.placement_table.find("master        ram"), std::string::npos)
          << speculative.placement_table;
      EXPECT_NE(speculative.placement_table.find("speculative update on"), std::string::npos)
          << speculative.placement_table;
    }
    for (const StepReport& r : speculative.reports) EXPECT_TRUE(r.speculation_committed) << r.step;
    ExpectBitwise(normal, speculative);
  }
}

TEST(SpeculativeRamUpdateTest, WithoutRamForTheAlternatesItIsOffAndSaysSo) {
  TrainerOptions o = StateInRam(0.0, true);
  o.memory.budgets.ram = StateBytes(BaseOptions()) + (size_t{1} << 20);  // m and v once
  const TrainedRun run = Train(o, 2);
  ASSERT_EQ(run.reports.size(), 2u);
  EXPECT_NE(run.placement_table.find("speculative update off: its alternate master/m/v arrays "
                                     "need"),
            std::string::npos)
      << run.placement_table;
  for (const StepReport& r : run.reports) EXPECT_EQ(r.speculated_entries, 0);
}

// Three committed steps (the current arrays are the once-alternate ones now), then a checkpoint
// written in the background while step 4 speculates: it holds the state after step 3, and
// resumes (with and without speculation) into the uninterrupted run's bits.
TEST(SpeculativeRamUpdateTest, ACheckpointWrittenBesideTheNextStepResumesBitwise) {
  absl::Status direct_io;  // not needed: nothing is on NVMe
  const std::string dir = tiers::FreshTestDir("speculative_ram_resume", &direct_io);
  const TrainedRun uninterrupted = Train(StateInRam(0.0, false), 5);
  ASSERT_EQ(uninterrupted.reports.size(), 5u);
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  std::string checkpoint;
  {
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), StateInRam(0.0, true));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    AsyncCheckpointWriter writer;
    for (int step = 0; step < 5; ++step) {
      if (step == 3) {
        ASSERT_TRUE(writer.Start(**trainer, dir + "/checkpoints", CheckpointRunInfo{}).ok());
      }
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->speculation_committed) << step;
      EXPECT_EQ(std::memcmp(&r->loss, &uninterrupted.reports[step].loss, sizeof(double)), 0)
          << "step " << step;
    }
    auto written = writer.Wait();
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_TRUE(written->has_value());
    checkpoint = **written;
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    Outcome through;
    ReadStore((*trainer)->store(), &through);
    ExpectSameState(uninterrupted.outcome, through);
  }
  for (bool speculate : {true, false}) {
    SCOPED_TRACE(speculate);
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), StateInRam(0.0, speculate));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto loaded = LoadCheckpoint(checkpoint, **trainer);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ((*trainer)->steps_done(), 3u);
    for (int step = 3; step < 5; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(std::memcmp(&r->loss, &uninterrupted.reports[step].loss, sizeof(double)), 0)
          << "step " << step;
      EXPECT_EQ(r->speculation_committed, speculate);
    }
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    Outcome resumed;
    ReadStore((*trainer)->store(), &resumed);
    ExpectSameState(uninterrupted.outcome, resumed);
  }
}

// The store's side of the RAM form: alternates in their current arrays' tiers (the master's
// pinned, m's and v's pageable, counted in pageable_ram_bytes), a commit that swaps pointers and
// copies nothing, a bf16 compute copy (a GPU's) restored from the master after a discard, and the
// placements it cannot serve refused naming the field.
TEST(SpeculativeRamUpdateTest, TheStoreSwapsAlternatesByPointerAndRestoresTheCopy) {
  auto device = MakeCpuDevice(size_t{32} << 20);
  const std::vector<EntrySpec> specs = {{1000, {{0, 1000, true}}}, {77, {{0, 77, false}}}};
  StorePlacement placement;
  placement.compute_copy_bf16 = true;
  placement.master_pinned = true;
  auto plain = ParameterStore::Create(*device, specs, placement);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->has_alternate_ram_state());
  EXPECT_EQ(plain->alternate(0).master, nullptr);
  placement.alternate_ram_state = true;
  const size_t pinned_before = device->pinned_stats().in_use;
  auto store = ParameterStore::Create(*device, specs, placement);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(store->has_alternate_ram_state());
  // The alternate master pinned like the master (with the gradients and the bf16 copy); m and v
  // and their alternates pageable.
  const size_t pinned = device->pinned_stats().in_use - pinned_before;
  EXPECT_EQ(pinned, plain->total_elements() * sizeof(float) * 3 + (500 + 39) * sizeof(float));
  EXPECT_EQ(store->pageable_ram_bytes(), plain->pageable_ram_bytes() * 2);

  const float* other_master = store->entry(1).master;
  const EntryBuffers current = store->entry(0);
  const EntryBuffers alternate = store->alternate(0);
  ASSERT_NE(alternate.master, nullptr);
  for (size_t i = 0; i < 1000; ++i) {
    current.master[i] = 0.5f + static_cast<float>(i);
    alternate.master[i] = -1.0f - static_cast<float>(i);
    alternate.m[i] = 2.0f;
    alternate.v[i] = 3.0f;
  }
  store->SwapAlternateState(0);
  EXPECT_EQ(store->entry(0).master, alternate.master);
  EXPECT_EQ(store->entry(0).m, alternate.m);
  EXPECT_EQ(store->entry(0).v, alternate.v);
  EXPECT_EQ(store->alternate(0).master, current.master);
  EXPECT_EQ(store->entry(1).master, other_master);  // only the entry committed
  EXPECT_EQ(store->entry(0).compute_bf16, current.compute_bf16);  // the copy stays where it is
  std::vector<float> m(1000), v(1000);
  ASSERT_TRUE(store->ReadOptimizerState(0, m.data(), v.data()).ok());
  EXPECT_EQ(m[999], 2.0f);
  EXPECT_EQ(v[0], 3.0f);
  // A speculation wrote the copy in place and was discarded: the copy follows the master again.
  for (size_t i = 0; i < 1000; ++i) current.compute_bf16[i] = 0x7777;
  ASSERT_TRUE(store->RestoreComputeCopyFromRamMaster(0).ok());
  for (size_t i = 0; i < 1000; i += 111) {
    EXPECT_EQ(store->entry(0).compute_bf16[i], kernels::Float32ToBf16Bits(-1.0f - i)) << i;
  }

  StorePlacement on_nvme = placement;
  on_nvme.states_on_nvme = true;
  on_nvme.nvme_dir = "/nonexistent";
  auto refused = ParameterStore::Create(*device, specs, on_nvme);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("alternate_ram_state"),
            std::string::npos)
      << refused.status();
}


// The mixed form (the master in RAM, m and v on NVMe): m and v through the state file's staging
// into their alternate regions, the master out of place into its alternate array; a commit flips
// the m/v chunks' parity and swaps the master pointers. Every step commits without clipping,
// with one micro-batch per step and with three, and the bits are those of the normal update.
TEST(SpeculativeMixedUpdateTest, WithoutClippingEverySpeculationCommitsBitwise) {
  const std::string dir = FreshDir("speculative_mixed_no_clip");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  for (int micro_batches : {1, 3}) {
    SCOPED_TRACE(micro_batches);
    const double clip = micro_batches == 1 ? 0.0 : 1e6;  // off, and a clip no norm reaches
    const TrainedRun normal = Train(MasterInRam(dir, clip, false), 4, nullptr, 1, micro_batches);
    const TrainedRun speculative =
        Train(MasterInRam(dir, clip, true), 4, nullptr, 1, micro_batches);
    ASSERT_EQ(speculative.reports.size(), 4u);
    EXPECT_NE(speculative.placement_table.find("master        pinned"), std::string::npos)
        << speculative.placement_table;
    EXPECT_NE(speculative.placement_table.find("speculative update on: alternate m/v regions "),
              std::string::npos)
        << speculative.placement_table;
    EXPECT_NE(speculative.placement_table.find(" on NVMe and master array "), std::string::npos)
        << speculative.placement_table;
    for (const StepReport& r : speculative.reports) {
      EXPECT_EQ(r.clip_coefficient, 1.0) << r.step;
      EXPECT_TRUE(r.speculation_committed) << r.step;
      EXPECT_EQ(r.speculated_entries, speculative.num_entries) << r.step;
      EXPECT_GT(r.nvme_bytes_written, 0u) << r.step;  // m and v to their alternate regions
    }
    ExpectBitwise(normal, speculative);
  }
}

// Committed and discarded steps (a clip between the run's norms), on one device and two; and a
// clip below every norm, where each step's speculation stops before its first entry.
TEST(SpeculativeMixedUpdateTest, ClippedStepsDiscardAndStopEarlyBitwise) {
  const std::string dir = FreshDir("speculative_mixed_clip");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  const double clip = ClipBetweenUnclippedNorms(dir);
  ASSERT_GT(clip, 0.0);
  const TrainedRun normal = Train(MasterInRam(dir, clip, false), 5);
  for (int devices : {1, 2}) {
    SCOPED_TRACE(devices);
    const TrainedRun speculative = Train(MasterInRam(dir, clip, true), 5, nullptr, devices);
    ASSERT_EQ(speculative.reports.size(), 5u);
    int committed = 0, discarded = 0;
    for (const StepReport& r : speculative.reports) {
      EXPECT_EQ(r.speculation_committed, r.clip_coefficient == 1.0) << r.step;
      (r.speculation_committed ? committed : discarded) += 1;
    }
    EXPECT_GT(committed, 0) << "clip " << clip;
    EXPECT_GT(discarded, 0) << "clip " << clip;
    ExpectBitwise(normal, speculative);
  }
  const TrainedRun never = Train(MasterInRam(dir, 1e-9, false), 3);
  const TrainedRun stopped = Train(MasterInRam(dir, 1e-9, true), 3);
  ASSERT_EQ(stopped.reports.size(), 3u);
  for (const StepReport& r : stopped.reports) {
    EXPECT_EQ(r.speculated_entries, 0) << r.step;
    EXPECT_FALSE(r.speculation_committed) << r.step;
  }
  ExpectBitwise(never, stopped);
}

// A non-finite step discards what the speculation wrote (alternate regions and arrays of every
// entry it reached); a pageable master (its alternate pageable too) and gradients on NVMe (read
// from the staging their last copy-out left) commit bitwise.
TEST(SpeculativeMixedUpdateTest, ANonFiniteStepAPageableMasterAndNvmeGradientsAreBitwise) {
  const std::string dir = FreshDir("speculative_mixed_variants");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  std::vector<float> saved;
  const auto poison = [&saved](Trainer& t, int step) {
    const int e = t.layout().layer_entry(5);
    ASSERT_TRUE(t.UpdateStatus().ok());
    if (step == 2) {
      saved.assign(t.store().spec(e).elements, 0.0f);
      ASSERT_TRUE(t.store().ReadMaster(e, saved.data()).ok());
      std::vector<float> bad = saved;
      bad[7] = std::numeric_limits<float>::infinity();
      ASSERT_TRUE(t.mutable_store().WriteMaster(e, bad.data()).ok());
    } else if (step == 3) {
      ASSERT_TRUE(t.mutable_store().WriteMaster(e, saved.data()).ok());
    }
  };
  const TrainedRun normal = Train(MasterInRam(dir, 0.0, false), 5, poison);
  const TrainedRun speculative = Train(MasterInRam(dir, 0.0, true), 5, poison);
  ASSERT_EQ(speculative.reports.size(), 5u);
  EXPECT_TRUE(speculative.reports[2].skipped);
  EXPECT_GT(speculative.reports[2].speculated_entries, 0);
  EXPECT_FALSE(speculative.reports[2].speculation_committed);
  for (int s : {0, 1, 3, 4}) EXPECT_TRUE(speculative.reports[s].speculation_committed) << s;
  ExpectBitwise(normal, speculative);

  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant);
    TrainerOptions o = MasterInRam(dir, 0.0, false);
    if (variant == 0) {
      // Pinned room for the gradients only: the master, and so its alternate, pageable.
      o.memory.budgets.pinned_ram = StateBytes(BaseOptions()) / 2 + (size_t{1} << 20);
      o.memory.budgets.ram = 2 * StateBytes(BaseOptions());
    } else {
      o.memory.grad_on_nvme = true;
    }
    const TrainedRun a = Train(o, 4);
    o.speculative_update = true;
    const TrainedRun b = Train(o, 4);
    ASSERT_EQ(b.reports.size(), 4u);
    EXPECT_NE(b.placement_table.find(variant == 0 ? "master        ram" : "grad          nvme"),
              std::string::npos)
        << b.placement_table;
    for (const StepReport& r : b.reports) EXPECT_TRUE(r.speculation_committed) << r.step;
    ExpectBitwise(a, b);
  }
}

// Three committed steps (the current master arrays are the once-alternate ones, the current m
// and v the once-alternate regions), a checkpoint started between them and step 4 (with the
// state on NVMe the writer writes it before returning), then two more speculating steps; the
// checkpoint resumes with and without speculation into the uninterrupted run's bits.
TEST(SpeculativeMixedUpdateTest, ACheckpointBesideASpeculatingRunResumesBitwise) {
  const std::string dir = FreshDir("speculative_mixed_resume");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  const TrainedRun uninterrupted = Train(MasterInRam(dir + "/whole", 0.0, false), 5);
  ASSERT_EQ(uninterrupted.reports.size(), 5u);
  const auto batches = MakeTokenBatches(10, 48, DeepNarrow().vocab, 17);
  std::string checkpoint;
  {
    const TrainerOptions o = MasterInRam(dir + "/first", 0.0, true);
    std::filesystem::create_directories(o.memory.budgets.nvme_dir);
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    AsyncCheckpointWriter writer;
    for (int step = 0; step < 5; ++step) {
      if (step == 3) {
        ASSERT_TRUE(writer.Start(**trainer, dir + "/checkpoints", CheckpointRunInfo{}).ok());
        // The writer waited for step 3's pass: its commits flipped the parity a third time.
        EXPECT_EQ((*trainer)->store().state_store()->current_region(0), 1);
      }
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->speculation_committed) << step;
      EXPECT_EQ(std::memcmp(&r->loss, &uninterrupted.reports[step].loss, sizeof(double)), 0)
          << "step " << step;
    }
    auto written = writer.Wait();
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_TRUE(written->has_value());
    checkpoint = **written;
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    Outcome through;
    ReadStore((*trainer)->store(), &through);
    ExpectSameState(uninterrupted.outcome, through);
  }
  for (bool speculate : {true, false}) {
    SCOPED_TRACE(speculate);
    const TrainerOptions o = MasterInRam(dir + "/second", 0.0, speculate);
    std::filesystem::create_directories(o.memory.budgets.nvme_dir);
    auto device = MakeCpuDevice(size_t{32} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(DeepNarrow()), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto loaded = LoadCheckpoint(checkpoint, **trainer);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ((*trainer)->steps_done(), 3u);
    for (int step = 3; step < 5; ++step) {
      auto r =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(std::memcmp(&r->loss, &uninterrupted.reports[step].loss, sizeof(double)), 0)
          << "step " << step;
      EXPECT_EQ(r->speculation_committed, speculate);
    }
    ASSERT_TRUE((*trainer)->UpdateStatus().ok());
    Outcome resumed;
    ReadStore((*trainer)->store(), &resumed);
    ExpectSameState(uninterrupted.outcome, resumed);
  }
}

// The store's side of the mixed form: only the master gets an alternate array (m and v have
// their regions in the state file), a swap exchanges the master alone, and the form needs the
// state file's alternate regions.
TEST(SpeculativeMixedUpdateTest, TheStoreKeepsAnAlternateMasterOnlyBesideNvmeStates) {
  const std::string dir = FreshDir("speculative_mixed_store");
  if (dir.empty()) GTEST_SKIP() << "no O_DIRECT scratch directory";
  auto device = MakeCpuDevice(size_t{32} << 20);
  const std::vector<EntrySpec> specs = {{1000, {{0, 1000, true}}}, {77, {{0, 77, false}}}};
  StorePlacement placement;
  placement.states_on_nvme = true;
  placement.nvme_dir = dir;
  placement.nvme_chunk_bytes = kSmallChunk;
  placement.alternate_ram_state = true;
  auto refused = ParameterStore::Create(*device, specs, placement);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("alternate_state_regions"),
            std::string::npos)
      << refused.status();
  placement.alternate_state_regions = true;
  auto store = ParameterStore::Create(*device, specs, placement);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(store->has_alternate_ram_state());
  ASSERT_NE(store->state_store(), nullptr);
  const EntryBuffers current = store->entry(0);
  const EntryBuffers alternate = store->alternate(0);
  ASSERT_NE(alternate.master, nullptr);
  EXPECT_NE(alternate.master, current.master);
  EXPECT_EQ(alternate.m, nullptr);
  EXPECT_EQ(alternate.v, nullptr);
  EXPECT_EQ(current.m, nullptr);  // on NVMe
  for (size_t i = 0; i < 1000; ++i) alternate.master[i] = 0.25f * static_cast<float>(i);
  const float* other_master = store->entry(1).master;
  store->SwapAlternateState(0);
  EXPECT_EQ(store->entry(0).master, alternate.master);
  EXPECT_EQ(store->alternate(0).master, current.master);
  EXPECT_EQ(store->entry(1).master, other_master);
  std::vector<float> master(1000);
  ASSERT_TRUE(store->ReadMaster(0, master.data()).ok());
  EXPECT_EQ(master[999], 0.25f * 999);
}

}  // namespace
}  // namespace megatrain::engine
