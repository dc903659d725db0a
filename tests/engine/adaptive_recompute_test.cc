// Adaptive recomputation: losses, gradients and weights after 3 steps are
// bitwise identical whatever each block's mode (recompute, keep, offload,
// adaptive, forced mixes), tied or untied, throttled link or not; a budget
// below the working sets fails naming the minimum; the adaptive policy follows
// a link that slows down between steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/model/parameter_layout.h"
#include "engine/exec/executor_geometry.h"
#include "tests/engine/bitwise_compare.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr ActivationMode kR = ActivationMode::kRecompute;
constexpr ActivationMode kK = ActivationMode::kKeep;
constexpr ActivationMode kO = ActivationMode::kOffload;
constexpr int kSteps = 3;

struct RunConfig {
  std::string name;
  int k = 2;
  ActivationPolicyKind policy = ActivationPolicyKind::kRecompute;
  int budget_sets = 0;  // activation sets the budget holds; 0 = no budget
  std::vector<ActivationMode> forced = {};
  double link_gbps = 0;
  double ring_layers = 0;  // fragmented weight streaming: ring of this many layers (0 = slots)
};

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> masters, grads;
  std::vector<std::vector<std::string>> modes;  // per step, per block
};

TrainerOptions Options(const RunConfig& rc) {
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 23;
  o.head_chunk = 16;
  o.lr.peak_lr = 3e-3;
  o.lr.warmup_steps = 2;
  o.lr.total_steps = 5;
  o.grad_clip = 0.5;
  o.executor.checkpoint_interval = rc.k;
  o.executor.weight_slots = 2;
  o.executor.activation_policy = rc.policy;
  o.executor.block_modes = rc.forced;
  return o;
}

// Bytes one layer's tensors take in the weight ring.
size_t LayerRingBytes(const TinyShape& shape) {
  const ModelConfig config = TinyConfig(shape);
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  if (!layout.ok()) abort();
  absl::StatusOr<ExecutorGeometry> g = MakeExecutorGeometry(config, *layout, 2, 23, 16);
  if (!g.ok()) abort();
  return StreamingExecutor::LayerRingBytes(g->dims, g->layout.layer_offsets);
}

// Bytes of one saved-activation set of the shape (the default plan holds k).
size_t SetBytes(const TinyShape& shape) {
  auto device = MakeCpuDevice(size_t{256} << 20);
  RunConfig rc;
  auto trainer = Trainer::Create(*device, TinyConfig(shape), Options(rc));
  if (!trainer.ok()) abort();
  return (*trainer)->executor().plan().activations / static_cast<size_t>(rc.k);
}

void Snapshot(Trainer& trainer, RunResult& result) {
  trainer.WaitForUpdates();
  const ParameterStore& store = trainer.store();
  for (int e = 0; e < store.num_entries(); ++e) {
    const size_t n = store.spec(e).elements;
    result.masters.emplace_back(store.entry(e).master, store.entry(e).master + n);
    result.grads.emplace_back(store.entry(e).grad, store.entry(e).grad + n);
  }
}

RunResult Train(const RunConfig& rc, const TinyShape& shape, size_t set_bytes) {
  RunResult result;
  auto device = MakeCpuDevice(size_t{256} << 20, rc.link_gbps, rc.link_gbps > 0 ? 5 : 0);
  TrainerOptions o = Options(rc);
  o.executor.activation_budget_bytes = static_cast<size_t>(rc.budget_sets) * set_bytes;
  if (rc.ring_layers > 0) {
    o.executor.weight_ring_bytes =
        static_cast<size_t>(rc.ring_layers * static_cast<double>(LayerRingBytes(shape)));
    o.executor.fragment_bytes = 1001;
  }
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  EXPECT_TRUE(trainer.ok()) << rc.name << ": " << trainer.status();
  if (!trainer.ok()) return result;
  (*trainer)->InitializeRandom(7);
  const auto batches = MakeTokenBatches(2 * kSteps, 2 * 23, shape.vocab, 99);
  for (int step = 0; step < kSteps; ++step) {
    auto report =
        (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    EXPECT_TRUE(report.ok()) << rc.name << ": " << report.status();
    if (!report.ok()) return result;
    result.losses.push_back(report->loss);
    std::vector<std::string> modes;
    for (const ActivationBlockReport& b : report->activation_blocks) {
      modes.push_back(b.mode);
      EXPECT_FALSE(b.reason.empty()) << rc.name;
    }
    result.modes.push_back(modes);
  }
  Snapshot(**trainer, result);
  return result;
}

void ExpectBitwiseEqual(const RunResult& a, const RunResult& b, const std::string& name) {
  testing::ExpectSameLosses(a.losses, b.losses, name);
  testing::ExpectSameArrays(a.masters, b.masters, name + " masters");
  testing::ExpectSameArrays(a.grads, b.grads, name + " gradients");
}

std::vector<std::string> Names(const std::vector<ActivationMode>& modes) {
  std::vector<std::string> names;
  for (ActivationMode m : modes) names.push_back(ActivationModeName(m));
  return names;
}

TEST(AdaptiveRecomputeTest, ResultsAreBitwiseIdenticalWhateverTheBlockModes) {
  for (bool tied : {false, true}) {
    TinyShape shape;
    shape.layers = 7;  // k = 2: blocks [0,2) [2,4) [4,6) and the top [6]
    shape.tied = tied;
    const size_t set_bytes = SetBytes(shape);
    ASSERT_GT(set_bytes, 0u);
    for (double gbps : {0.0, 2.0}) {
      const std::string suffix =
          std::string(tied ? " (tied" : " (untied") + (gbps > 0 ? ", throttled)" : ")");
      const RunResult reference = Train({.name = "recompute", .link_gbps = gbps}, shape, set_bytes);
      ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
      for (double loss : reference.losses) EXPECT_TRUE(std::isfinite(loss));
      EXPECT_EQ(reference.modes[0], Names({kR, kR, kR, kK}));

      const std::vector<RunConfig> variants = {
          {.name = "offload", .policy = ActivationPolicyKind::kOffload, .link_gbps = gbps},
          {.name = "keep where the budget fits", .budget_sets = 2 + 2, .link_gbps = gbps},
          {.name = "adaptive",
           .policy = ActivationPolicyKind::kAdaptive,
           .budget_sets = 2 + 2,
           .link_gbps = gbps},
          {.name = "forced offload/keep/recompute", .forced = {kO, kK, kR}, .link_gbps = gbps},
          {.name = "forced keep all", .forced = {kK, kK, kK}, .link_gbps = gbps},
          {.name = "forced recompute/offload/offload", .forced = {kR, kO, kO}, .link_gbps = gbps},
          {.name = "offload, k=1",
           .k = 1,
           .policy = ActivationPolicyKind::kOffload,
           .link_gbps = gbps},
          {.name = "forced mix, k=3", .k = 3, .forced = {kO, kR}, .link_gbps = gbps},
          // Fragmented weight streaming re-plans its fragments with the modes.
          {.name = "forced mix, ring of 1/2 layer",
           .forced = {kO, kK, kR},
           .link_gbps = gbps,
           .ring_layers = 0.5},
          {.name = "adaptive, ring of 1 layer",
           .policy = ActivationPolicyKind::kAdaptive,
           .budget_sets = 2 + 2,
           .link_gbps = gbps,
           .ring_layers = 1.0},
      };
      for (const RunConfig& rc : variants) {
        const RunResult run = Train(rc, shape, set_bytes);
        ExpectBitwiseEqual(reference, run, rc.name + suffix);
        if (run.modes.empty()) continue;
        if (rc.name == "offload") {
          EXPECT_EQ(run.modes[0], Names({kO, kO, kO, kK}));
        }
        if (rc.name == "keep where the budget fits") {
          EXPECT_EQ(run.modes[0], Names({kR, kR, kK, kK}));
        }
        if (rc.name == "forced offload/keep/recompute") {
          EXPECT_EQ(run.modes[2], Names({kO, kK, kR, kK}));
        }
      }
    }
  }
}

TEST(AdaptiveRecomputeTest, BudgetBelowTheWorkingSetsFailsNamingTheMinimum) {
  TinyShape shape;
  shape.layers = 5;
  auto device = MakeCpuDevice(size_t{256} << 20);
  TrainerOptions o = Options(RunConfig{});
  o.executor.activation_budget_bytes = 1000;
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find("activation_budget_bytes=1000 is below the minimum"),
            std::string::npos)
      << trainer.status();
}

TEST(AdaptiveRecomputeTest, ForcedKeepsBeyondTheBudgetAreRejected) {
  TinyShape shape;
  shape.layers = 7;
  const size_t set_bytes = SetBytes(shape);
  auto device = MakeCpuDevice(size_t{256} << 20);
  TrainerOptions o = Options(RunConfig{});
  o.executor.activation_budget_bytes = 4 * set_bytes;  // one block keeps
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const StreamingExecutor& executor = (*trainer)->executor();
  EXPECT_EQ(executor.plan().activations, 4 * set_bytes);
  auto& mutable_executor = const_cast<StreamingExecutor&>(executor);
  EXPECT_TRUE(mutable_executor.SetBlockModes({kK, kO, kR}).ok());
  EXPECT_EQ(mutable_executor.SetBlockModes({kK, kK, kR}).code(),
            absl::StatusCode::kInvalidArgument);
}

// Streaming weights through a fragment ring, an executor created with kept and offloaded blocks
// may be switched to recompute them all: its fragment events were made for the all-recompute
// plan, which needs the most fragments (the recompute forwards read weights too).
TEST(AdaptiveRecomputeTest, FragmentModeCreatedWithKeptBlocksSwitchesToRecompute) {
  TinyShape shape;
  shape.layers = 7;
  const size_t set_bytes = SetBytes(shape);
  auto device = MakeCpuDevice(size_t{256} << 20);
  RunConfig rc;
  rc.forced = {kK, kO, kR};
  TrainerOptions o = Options(rc);
  o.executor.activation_budget_bytes = 4 * set_bytes;  // one block keeps
  o.executor.weight_ring_bytes = static_cast<size_t>(0.7 * LayerRingBytes(shape));
  o.executor.fragment_bytes = 1001;
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto& executor = const_cast<StreamingExecutor&>((*trainer)->executor());
  const absl::Status all_recompute = executor.SetBlockModes({kR, kR, kR});
  EXPECT_TRUE(all_recompute.ok()) << all_recompute;
  (*trainer)->InitializeRandom(7);
  const auto batches = MakeTokenBatches(2, 2 * 23, shape.vocab, 99);
  auto report = (*trainer)->Step(batches.InputPointers(0, 2), batches.TargetPointers(0, 2));
  EXPECT_TRUE(report.ok()) << report.status();
}

TEST(AdaptiveRecomputeTest, AdaptiveDecisionFollowsTheLinkBetweenSteps) {
  TinyShape shape;
  shape.layers = 7;
  constexpr int kLinkSteps = 5;
  auto run = [&](bool adaptive, RunResult& result) {
    auto device = MakeCpuDevice(size_t{256} << 20);
    RunConfig rc;
    if (adaptive) rc.policy = ActivationPolicyKind::kAdaptive;
    auto trainer = Trainer::Create(*device, TinyConfig(shape), Options(rc));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(7);
    const auto batches = MakeTokenBatches(2 * kLinkSteps, 2 * 23, shape.vocab, 5);
    for (int step = 0; step < kLinkSteps; ++step) {
      // Another process takes most of the link from the fourth step on.
      if (step == 3) {
        ASSERT_TRUE(device->SetLinkGbps(0.01).ok());
      }
      auto report =
          (*trainer)->Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
      ASSERT_TRUE(report.ok()) << report.status();
      result.losses.push_back(report->loss);
      std::vector<std::string> modes;
      for (const ActivationBlockReport& b : report->activation_blocks) modes.push_back(b.mode);
      result.modes.push_back(modes);
    }
    Snapshot(**trainer, result);
  };
  RunResult adaptive, fixed;
  run(true, adaptive);
  run(false, fixed);
  ASSERT_EQ(adaptive.modes.size(), static_cast<size_t>(kLinkSteps));
  // Step 1 has no measurement yet; steps 2-3 run on a fast link (memcpy):
  // copies hide behind compute, so blocks offload.
  EXPECT_EQ(adaptive.modes[0], Names({kR, kR, kR, kK}));
  EXPECT_EQ(adaptive.modes[2], Names({kO, kO, kO, kK}));
  // Step 4 measured the slow link: the last step recomputes again.
  EXPECT_EQ(adaptive.modes[4], Names({kR, kR, kR, kK}));
  ExpectBitwiseEqual(fixed, adaptive, "adaptive vs recompute across the link change");
}

}  // namespace
}  // namespace megatrain::engine
