// Tests of the planner on GPU profiles: host bytes per parameter, device plans independent of
// depth, the bottleneck moving with the link, and the largest-fit search.
#include "engine/planner/planner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/planner/model_presets.h"

namespace megatrain::engine::planner {
namespace {

HardwareProfile Gpu(const std::string& name) {
  return *FindHardwareProfile(BuiltinHardwareProfiles(), name);
}

// Qwen2.5-7B's layers with a 32000-token vocabulary: its LM head is smaller than a layer, so a
// ring of one layer holds every tensor (Qwen's own 152064-token head is 2.3 layers).
ModelConfig SmallVocab7b() {
  ModelConfig c = *ModelPreset("qwen2.5-7b");
  c.vocab_size = 32000;
  return c;
}

TEST(PlannerTest, HostBytesPerParameterIs18OnAGpu) {
  const ModelConfig c = *ModelPreset("qwen2.5-7b");
  PlanInputs in;
  in.micro_batch = 4;
  in.seq = 1024;
  absl::StatusOr<PlanResult> p = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->parameters / 1e9, 7.6, 0.1);
  const double per_param = static_cast<double>(p->host_store_bytes) / p->parameters;
  EXPECT_NEAR(per_param, 18.0, 0.05);
  EXPECT_TRUE(p->fits_device);
  EXPECT_GT(p->time.step_seconds, 0);
  EXPECT_GT(p->time.model_tflops, 0);
  EXPECT_LT(p->time.model_tflops, 756);
  EXPECT_FALSE(p->Table().empty());
  EXPECT_NE(p->ToJson().find("\"bottleneck\""), std::string::npos);
}

// The Qwen3 presets are Qwen3 configs (head_dim 128 whatever the width), and the plan counts
// their per-head q/k norms: 2 * head_dim parameters per layer on top of the projections.
TEST(PlannerTest, Qwen3PresetsCountTheirQkNorms) {
  for (const char* name :
       {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"}) {
    absl::StatusOr<ModelConfig> c = ModelPreset(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->family, ModelFamily::kQwen3) << name;
    EXPECT_EQ(c->head_dim, 128) << name;
    EXPECT_TRUE(c->qk_norm) << name;
  }
  const ModelConfig c = *ModelPreset("qwen3-0.6b");
  PlanInputs in;
  in.micro_batch = 1;
  in.seq = 1024;
  absl::StatusOr<PlanResult> p = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(p.ok()) << p.status();
  // Qwen3-0.6B: 596,049,920 parameters, 28 * 2 * 128 of them in the q/k norms.
  EXPECT_EQ(p->parameters, int64_t{596049920});
  ModelConfig without_norms = c;
  without_norms.qk_norm = false;
  absl::StatusOr<PlanResult> q = Plan(without_norms, in, Gpu("h100-pcie"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(p->parameters - q->parameters, 28 * 2 * 128);
}

TEST(PlannerTest, DevicePeakDoesNotDependOnDepth) {
  ModelConfig c = *ModelPreset("qwen2.5-14b");
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 512;
  in.device_checkpoints = 0;
  const uint64_t shallow = Plan(c, in, Gpu("gh200"))->device_arena_peak;
  c.num_hidden_layers *= 3;
  EXPECT_EQ(Plan(c, in, Gpu("gh200"))->device_arena_peak, shallow);
}

TEST(PlannerTest, SlowLinkMakesCopyInTheBottleneck) {
  const ModelConfig c = *ModelPreset("qwen2.5-7b");
  PlanInputs in;
  in.micro_batch = 1;
  in.seq = 128;
  HardwareProfile hw = Gpu("h100-pcie");
  hw.h2d_gbps = hw.d2h_gbps = 1;
  absl::StatusOr<PlanResult> p = Plan(c, in, hw);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->time.bottleneck, "copy-in");
  EXPECT_GT(p->time.stall_seconds, 0.5 * p->time.copy_in_seconds);
}

TEST(PlannerTest, NvmeMovesStatesAndAddsTheirTraffic) {
  const ModelConfig c = *ModelPreset("qwen2.5-7b");
  PlanInputs in;
  in.budgets_enabled = true;
  in.budgets.pinned_ram = uint64_t{40} << 30;
  in.budgets.ram = uint64_t{80} << 30;
  in.budgets.nvme_dir = "/nvme";
  in.budgets.nvme_bytes = uint64_t{200} << 30;
  absl::StatusOr<PlanResult> p = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->placement.tier(tiers::BufferKind::kM), tiers::Tier::kNvme);
  EXPECT_NEAR(static_cast<double>(p->nvme_bytes) / p->parameters, 8.0, 0.05);
  EXPECT_GT(p->time.nvme_seconds, 0);
  in.budgets.ram = uint64_t{1} << 30;
  EXPECT_EQ(Plan(c, in, Gpu("h100-pcie")).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PlannerTest, LargestModelGrowsWithHostMemory) {
  const ModelConfig c = *ModelPreset("qwen2.5-72b");
  PlanInputs in;
  in.seq = 1024;
  in.budgets_enabled = true;
  in.budgets.pinned_ram = uint64_t{200} << 30;
  in.budgets.ram = uint64_t{400} << 30;
  absl::StatusOr<LargestFit> small = LargestModelThatFits(c, in, Gpu("h200"));
  ASSERT_TRUE(small.ok()) << small.status();
  in.budgets.ram = uint64_t{1300} << 30;
  absl::StatusOr<LargestFit> big = LargestModelThatFits(c, in, Gpu("h200"));
  ASSERT_TRUE(big.ok());
  EXPECT_GT(big->parameters, 2 * small->parameters);
  // 18 bytes/param: 1.5 TB holds about 80B parameters of this shape.
  EXPECT_LE(static_cast<double>(big->plan.host_store_bytes),
            static_cast<double>(in.budgets.pinned_ram + in.budgets.ram));
  ModelConfig one_more = c;
  one_more.num_hidden_layers = big->num_layers + 1;
  EXPECT_FALSE(Plan(one_more, in, Gpu("h200")).ok());
}

TEST(PlannerTest, BadInputsNameTheField) {
  const ModelConfig c = *ModelPreset("qwen2.5-0.5b");
  PlanInputs in;
  in.weight_slots = 1;
  EXPECT_NE(Plan(c, in, Gpu("h100-sxm")).status().message().find("weight_slots=1"),
            std::string::npos);
  in.weight_slots = 2;
  in.grad_accumulation = 0;
  EXPECT_NE(Plan(c, in, Gpu("h100-sxm")).status().message().find("grad_accumulation=0"),
            std::string::npos);
}

TEST(PlannerTest, ActivationBudgetKeepsBlocksAndPrintsPerBlockModes) {
  const ModelConfig c = *ModelPreset("qwen2.5-7b");
  PlanInputs in;
  in.micro_batch = 1;
  in.seq = 1024;
  in.checkpoint_interval = 4;
  in.activation_policy = ActivationPolicyKind::kAdaptive;
  const absl::StatusOr<PlanResult> base = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(base.ok()) << base.status();
  const int blocks = (c.num_hidden_layers + 3) / 4;
  ASSERT_EQ(static_cast<int>(base->activation.blocks.size()), blocks);
  EXPECT_EQ(base->activation.blocks.back().mode, ActivationMode::kKeep);
  const uint64_t set_bytes = base->device.activations / 4;
  // Room for two more blocks of 4 sets: they keep, and the plan grows by them.
  in.activation_budget_bytes = base->device.activations + 8 * set_bytes;
  const absl::StatusOr<PlanResult> kept = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->device.activations, base->device.activations + 8 * set_bytes);
  int keeps = 0;
  for (const BlockDecision& b : kept->activation.blocks) keeps += b.mode == ActivationMode::kKeep;
  EXPECT_EQ(keeps, 3);
  EXPECT_NE(kept->Table().find("activation blocks (policy adaptive)"), std::string::npos);
  EXPECT_NE(kept->Table().find("device peak for weights"), std::string::npos);
  EXPECT_NE(kept->ToJson().find("\"activation\""), std::string::npos);
  // Below the working sets: the error names the minimum.
  in.activation_budget_bytes = set_bytes;
  const absl::StatusOr<PlanResult> small = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("below the minimum"), std::string::npos);
}

TEST(PlannerTest, WeightRingReplacesTheSlotsInTheDevicePlan) {
  const ModelConfig c = SmallVocab7b();
  PlanInputs in;
  in.seq = 512;
  in.weight_ring_layers = 1;
  const absl::StatusOr<PlanResult> ring = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_GT(ring->layer_ring_bytes, 0u);
  EXPECT_EQ(ring->executor.weight_ring_bytes, ring->layer_ring_bytes);
  EXPECT_TRUE(ring->device.weight_ring);
  EXPECT_EQ(ring->device.weight_slots, (ring->layer_ring_bytes + 255) / 256 * 256);
  EXPECT_EQ(ring->weight_slots, 0);
  EXPECT_GT(ring->step_fragments, 2 * c.num_hidden_layers);
  // The same ring in bytes is the same plan.
  in.weight_ring_layers = 0;
  in.weight_ring_bytes = ring->layer_ring_bytes;
  const absl::StatusOr<PlanResult> bytes = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->device_arena_peak, ring->device_arena_peak);
  EXPECT_NE(ring->Table().find("weight ring 1.00 layers"), std::string::npos) << ring->Table();
  EXPECT_NE(ring->ToJson().find("\"step_fragments\""), std::string::npos);
  // Two whole-layer slots take more device memory than a ring of one layer.
  in.weight_ring_bytes = 0;
  const absl::StatusOr<PlanResult> slots = Plan(c, in, Gpu("h100-pcie"));
  ASSERT_TRUE(slots.ok());
  EXPECT_GT(slots->device.weight_slots, ring->device.weight_slots);
}

TEST(PlannerTest, RingSmallerThanTheLargestTensorIsRefusedNamingIt) {
  const ModelConfig c = *ModelPreset("qwen2.5-0.5b");
  PlanInputs in;
  in.weight_ring_bytes = 1 << 20;  // the 0.5B model's LM head alone is ~272 MB in bf16
  const absl::StatusOr<PlanResult> p = Plan(c, in, Gpu("h100-sxm"));
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find("weight_ring_bytes=1048576 is smaller than tensor"),
            std::string::npos)
      << p.status();
  in.weight_ring_layers = 2;
  EXPECT_NE(Plan(c, in, Gpu("h100-sxm")).status().message().find("not both"), std::string::npos);
  in.weight_ring_bytes = 0;
  in.weight_ring_layers = -1;
  EXPECT_NE(Plan(c, in, Gpu("h100-sxm")).status().message().find("weight_ring_layers=-1"),
            std::string::npos);
  in.weight_ring_layers = 0;
  in.fragment_bytes = 4096;
  EXPECT_NE(Plan(c, in, Gpu("h100-sxm")).status().message().find("fragment_bytes=4096 needs"),
            std::string::npos);
}

TEST(PlannerTest, FragmentStepTimeIsFiniteAndNoFasterThanSlotsOnASlowLink) {
  const ModelConfig c = SmallVocab7b();
  PlanInputs in;
  in.seq = 256;
  HardwareProfile hw = Gpu("h100-pcie");
  hw.h2d_gbps = hw.d2h_gbps = 1;
  const absl::StatusOr<PlanResult> slots = Plan(c, in, hw);
  ASSERT_TRUE(slots.ok()) << slots.status();
  double previous = 0;
  for (double layers : {4.0, 1.0, 0.5}) {
    SCOPED_TRACE(layers);
    in.weight_ring_layers = layers;
    const absl::StatusOr<PlanResult> ring = Plan(c, in, hw);
    ASSERT_TRUE(ring.ok()) << ring.status();
    EXPECT_TRUE(std::isfinite(ring->time.step_seconds));
    EXPECT_GE(ring->time.step_seconds, slots->time.step_seconds);
    EXPECT_EQ(ring->time.bottleneck, "copy-in");
    // A smaller ring never helps.
    EXPECT_GE(ring->time.step_seconds, previous);
    previous = ring->time.step_seconds;
  }
}

TEST(PlannerTest, RingOfOneLayerHidesAFastLinkLikeTwoSlots) {
  const ModelConfig c = SmallVocab7b();
  PlanInputs in;
  in.micro_batch = 4;
  in.seq = 2048;
  in.grad_accumulation = 8;
  const HardwareProfile hw = Gpu("h100-sxm");
  const absl::StatusOr<PlanResult> slots = Plan(c, in, hw);
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->time.bottleneck, "compute");
  in.weight_ring_layers = 1;
  const absl::StatusOr<PlanResult> ring = Plan(c, in, hw);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_TRUE(std::isfinite(ring->time.step_seconds));
  EXPECT_LT(ring->time.step_seconds, 1.10 * slots->time.step_seconds);
  EXPECT_GT(ring->time.step_seconds, 0.90 * slots->time.step_seconds);
}

}  // namespace
}  // namespace megatrain::engine::planner
