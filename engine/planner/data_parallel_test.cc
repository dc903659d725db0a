// Tests of the data-parallel prediction: the bytes over each link against hand-computed figures,
// the step of one device equal to the plan's, efficiency at most 1 and falling where a shared
// link is the limit, and each bottleneck named where it binds.
#include "engine/planner/data_parallel.h"

#include <gtest/gtest.h>

#include "engine/planner/model_presets.h"

namespace megatrain::engine::planner {
namespace {

HardwareProfile Gpu(const std::string& name) {
  return *FindHardwareProfile(BuiltinHardwareProfiles(), name);
}

PlanResult PlanOf(const std::string& preset, const PlanInputs& in, const HardwareProfile& hw) {
  absl::StatusOr<PlanResult> p = Plan(*ModelPreset(preset), in, hw);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

DataParallelPrediction Predict(const PlanResult& one, const HardwareProfile& hw, int devices,
                               int nodes = 1) {
  absl::StatusOr<DataParallelPrediction> p =
      PredictDataParallel(one, hw, DataParallelShape{devices, nodes});
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

// Llama-2-7B (untied, 32000 x 4096 embedding, no padding), micro-batch 2 x 512, 1 micro-batch.
constexpr double kLlama7bParameters = 6738415616.0;
constexpr double kLlama7bEmbedding = 32000.0 * 4096;

TEST(DataParallelTest, BytesOverEachLinkAreTheHandComputedOnes) {
  const HardwareProfile hw = Gpu("h100-sxm");
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 512;
  const PlanResult one = PlanOf("llama-2-7b", in, hw);
  ASSERT_EQ(one.parameters, static_cast<int64_t>(kLlama7bParameters));
  ASSERT_EQ(one.padded_elements, one.parameters);
  // Every gradient but the embedding's (rows scatter-added on the host) is reduced: fp32.
  const double reducible = (kLlama7bParameters - kLlama7bEmbedding) * 4;
  const DataParallelPrediction alone = Predict(one, hw, 1);
  EXPECT_EQ(alone.reduce_bytes_per_device, 0);
  EXPECT_EQ(alone.network_bytes_per_node, 0);
  for (int n : {2, 4, 8}) {
    const DataParallelPrediction p = Predict(one, hw, n);
    // Each device sends (N-1)/N of every reducible gradient to its peers and copies out 1/N.
    EXPECT_NEAR(p.reduce_bytes_per_device, reducible * (n - 1) / n, 1) << n;
    EXPECT_NEAR(p.link_out_bytes_per_device,
                alone.link_out_bytes_per_device - reducible * (n - 1) / n, 1)
        << n;
    EXPECT_EQ(p.link_in_bytes_per_device, alone.link_in_bytes_per_device) << n;
    // Host memory: N devices' copies in and out, the embedding's host adds (its zeroing pass
    // over a third of the rows' bytes, then the batch's rows: 12 B per element), and one
    // optimizer pass (28 B) and gradient norm (4 B) per parameter.
    const double adds = 12 * (kLlama7bEmbedding / 3 + 2 * 512 * 4096.0);
    EXPECT_NEAR(p.host_memory_bytes_per_node,
                n * (p.link_in_bytes_per_device + p.link_out_bytes_per_device + adds) +
                    32 * kLlama7bParameters,
                1e3)
        << n;
  }
  // Across nodes (ZeRO-1): each node sends (M-1)/M of the fp32 gradients (reduce-scatter) and
  // of the bf16 compute copy (all-gather); its optimizer pass covers 1/M of the parameters.
  const DataParallelPrediction two_nodes = Predict(one, hw, 8, 2);
  EXPECT_NEAR(two_nodes.network_bytes_per_node, kLlama7bParameters / 2 * (4 + 2), 1);
  EXPECT_NEAR(two_nodes.network_seconds, kLlama7bParameters / 2 * 6 / 50e9, 1e-9);
  const DataParallelPrediction one_node = Predict(one, hw, 8);
  EXPECT_NEAR(one_node.host_memory_bytes_per_node - two_nodes.host_memory_bytes_per_node,
              32 * kLlama7bParameters / 2, 1e3);
  EXPECT_NEAR(two_nodes.optimizer_seconds, one_node.optimizer_seconds / 2, 1e-9);
  EXPECT_EQ(two_nodes.tokens_per_step, 16.0 * 2 * 512);
}

// How a node's devices meet follows the trainer's auto rule: the whole sums reduce-scattered
// once a step where they fit; where only 1/N does, every micro-batch reduce-scattered into shard
// sums (kept on the device, 1/N out once a step); host turns for a tied embedding, for host sums
// asked for, and where neither fits: nothing to the peers, one device's copy-outs per link.
TEST(DataParallelTest, WithinANodeTheTrainersWayByFitAndModel) {
  const HardwareProfile hw = Gpu("h100-sxm");
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 512;
  in.grad_accumulation = 2;
  const PlanResult tied = PlanOf("qwen2.5-0.5b", in, hw);
  ASSERT_TRUE(tied.tied_embeddings);
  in.gradient_accumulation = GradientAccumulation::kHost;
  const PlanResult host_asked = PlanOf("llama-2-7b", in, hw);
  in.gradient_accumulation = GradientAccumulation::kAuto;
  // 3.2 GB of minimum plan fit 8 GiB, not beside a quarter of the sums (6.9 GB).
  in.device_arena_bytes = uint64_t{8} << 30;
  const PlanResult small_arena = PlanOf("llama-2-7b", in, hw);
  for (const PlanResult* one : {&tied, &host_asked, &small_arena}) {
    const DataParallelPrediction alone = Predict(*one, hw, 1);
    const DataParallelPrediction four = Predict(*one, hw, 4);
    EXPECT_EQ(four.within_node, WithinNode::kHostTurns);
    EXPECT_EQ(four.reduce_bytes_per_device, 0);
    EXPECT_EQ(four.link_out_bytes_per_device, alone.link_out_bytes_per_device);
    EXPECT_NE(ScalingTable({four}).find("host turns\n"), std::string::npos);
  }
  // 20 GiB: the minimum plan and a quarter of the sums, not the whole: shard sums, both
  // micro-batches reduce-scattered, only the last one's shard copied out.
  in.device_arena_bytes = uint64_t{20} << 30;
  const PlanResult shard_arena = PlanOf("llama-2-7b", in, hw);
  ASSERT_EQ(shard_arena.executor.gradient_accumulation, GradientAccumulation::kHost);
  const double reducible = (kLlama7bParameters - kLlama7bEmbedding) * 4;
  const DataParallelPrediction alone = Predict(shard_arena, hw, 1);
  const DataParallelPrediction four = Predict(shard_arena, hw, 4);
  EXPECT_EQ(four.within_node, WithinNode::kShardSums);
  EXPECT_NEAR(four.reduce_bytes_per_device, 2 * reducible * 3 / 4, 1);
  EXPECT_NEAR(four.link_out_bytes_per_device,
              alone.link_out_bytes_per_device - reducible - reducible * 3 / 4, 1);
  EXPECT_NE(ScalingTable({four}).find("shard sums\n"), std::string::npos);
  in.device_arena_bytes = 0;
  EXPECT_EQ(Predict(PlanOf("llama-2-7b", in, hw), hw, 4).within_node, WithinNode::kReduceScatter);
}

TEST(DataParallelTest, OneDeviceIsThePlan) {
  const HardwareProfile hw = Gpu("h100-pcie");
  PlanInputs in;
  in.micro_batch = 8;
  in.seq = 1024;
  in.grad_accumulation = 12;
  const PlanResult one = PlanOf("qwen2.5-7b", in, hw);
  const DataParallelPrediction p = Predict(one, hw, 1);
  EXPECT_DOUBLE_EQ(p.step_seconds, one.time.step_seconds);
  EXPECT_DOUBLE_EQ(p.tokens_per_second, one.time.tokens_per_second);
  EXPECT_DOUBLE_EQ(p.model_tflops, one.time.model_tflops);
  EXPECT_EQ(p.bottleneck, one.time.bottleneck);
  EXPECT_DOUBLE_EQ(p.efficiency, 1.0);
}

// A slow peer link (5 GB/s each way) against a host that never waits: the reduction grows with
// (N-1)/N, so efficiency stays at most 1 and falls with every doubling, and names the link.
TEST(DataParallelTest, EfficiencyFallsAndStaysAtMostOneWhenThePeerLinkLimits) {
  HardwareProfile hw = Gpu("h100-sxm");
  hw.h2d_gbps = hw.d2h_gbps = 5000;
  hw.host_memory_gbps = 1e6;
  hw.adamw_params_per_second = 1e13;
  hw.peer_gbps = 5;
  PlanInputs in;
  in.micro_batch = 4;
  in.seq = 1024;
  // Untied: the devices reduce-scatter (a tied embedding keeps them on the host's turns).
  const PlanResult one = PlanOf("qwen2.5-7b", in, hw);
  double previous = 1.0;
  for (int n : {2, 4, 8}) {
    const DataParallelPrediction p = Predict(one, hw, n);
    EXPECT_LE(p.efficiency, 1.0) << n;
    EXPECT_LT(p.efficiency, previous) << n;
    EXPECT_GT(p.tokens_per_second, 0);
    previous = p.efficiency;
  }
  EXPECT_EQ(Predict(one, hw, 8).bottleneck, "peer reduction");
}

TEST(DataParallelTest, EachSharedResourceIsNamedWhereItBinds) {
  PlanInputs in;
  in.micro_batch = 8;
  in.seq = 1024;
  in.grad_accumulation = 12;
  // Every micro-batch's gradients cross the host: the sums stay there, and an arena of 17 GiB
  // holds the 13.9 GB minimum plan but not an eighth of the sums (4.1 GB) beside it, so the
  // devices take turns.
  in.gradient_accumulation = GradientAccumulation::kHost;
  in.device_arena_bytes = uint64_t{17} << 30;
  const HardwareProfile sxm = Gpu("h100-sxm");
  const PlanResult seven_b = PlanOf("qwen2.5-7b", in, sxm);
  // Eight devices each copying every layer in, every micro-batch: 4.6 TB over 300 GB/s.
  const DataParallelPrediction eight = Predict(seven_b, sxm, 8);
  EXPECT_EQ(eight.bottleneck, "host memory");
  EXPECT_DOUBLE_EQ(eight.step_seconds, eight.host_memory_seconds);
  EXPECT_LT(eight.efficiency, Predict(seven_b, sxm, 4).efficiency);

  HardwareProfile slow_network = sxm;
  slow_network.network_gbps = 0.5;
  EXPECT_EQ(Predict(seven_b, slow_network, 8, 2).bottleneck, "network");

  HardwareProfile slow_cpu = sxm;
  slow_cpu.adamw_params_per_second = 1e8;
  EXPECT_EQ(Predict(PlanOf("qwen2.5-7b", in, slow_cpu), slow_cpu, 2).bottleneck, "host optimizer");

  PlanInputs nvme = in;
  nvme.budgets_enabled = true;
  nvme.budgets.pinned_ram = uint64_t{500} << 30;
  nvme.budgets.ram = uint64_t{500} << 30;
  nvme.budgets.nvme_dir = "/nvme";
  nvme.budgets.nvme_bytes = uint64_t{1} << 40;
  nvme.states_on_nvme = true;
  // The sums on the device and reduce-scattered: the host carries 1/N of the gradients.
  nvme.gradient_accumulation = GradientAccumulation::kAuto;
  nvme.device_arena_bytes = 0;
  EXPECT_EQ(Predict(PlanOf("qwen2.5-7b", nvme, sxm), sxm, 4).bottleneck, "nvme");
}

TEST(DataParallelTest, ShapesTheProfileCannotPredictAreRefusedByName) {
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 512;
  HardwareProfile hw = Gpu("h100-pcie");
  const PlanResult one = PlanOf("qwen2.5-0.5b", in, hw);
  absl::StatusOr<DataParallelPrediction> zero = PredictDataParallel(one, hw, {0, 1});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("devices=0"), std::string::npos);
  EXPECT_FALSE(PredictDataParallel(one, hw, {1, 0}).ok());
  hw.peer_gbps = 0;
  hw.network_gbps = 0;
  absl::StatusOr<DataParallelPrediction> peer = PredictDataParallel(one, hw, {2, 1});
  ASSERT_FALSE(peer.ok());
  EXPECT_NE(peer.status().message().find("peer_gbps"), std::string::npos);
  absl::StatusOr<DataParallelPrediction> net = PredictDataParallel(one, hw, {1, 2});
  ASSERT_FALSE(net.ok());
  EXPECT_NE(net.status().message().find("network_gbps"), std::string::npos);
  // The default table then holds the one device only.
  EXPECT_EQ(DefaultScalingShapes(hw).size(), 1u);
  EXPECT_EQ(DefaultScalingShapes(Gpu("h100-sxm")).size(), 6u);
}

TEST(DataParallelTest, TableAndJsonCarryEveryRow) {
  PlanInputs in;
  in.micro_batch = 2;
  in.seq = 512;
  const HardwareProfile hw = Gpu("h100-sxm");
  const PlanResult one = PlanOf("qwen2.5-0.5b", in, hw);
  absl::StatusOr<std::vector<DataParallelPrediction>> rows =
      PredictScaling(one, hw, DefaultScalingShapes(hw));
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::string table = ScalingTable(*rows);
  EXPECT_NE(table.find("efficiency"), std::string::npos);
  EXPECT_NE(table.find("\n     32     4 "), std::string::npos) << table;
  const std::string json = ScalingJson(*rows);
  EXPECT_NE(json.find("\"peer_reduction\""), std::string::npos);
  EXPECT_NE(json.find("\"nodes\": 4"), std::string::npos);
}

}  // namespace
}  // namespace megatrain::engine::planner
