// Tests the op schedule: every layer's backward follows a forward that saved
// its activations, recompute happens block by block, keep-all recomputes nothing.
#include "engine/exec/step_schedule.h"

#include <gtest/gtest.h>

#include <map>

namespace megatrain::engine {
namespace {

std::vector<std::string> Names(const std::vector<ScheduledOp>& ops) {
  std::vector<std::string> names;
  for (const auto& op : ops) names.push_back(DescribeOp(op));
  return names;
}

ScheduleShape Shape(int layers, int k, bool keep_all) {
  ScheduleShape s;
  s.num_layers = layers;
  s.checkpoint_interval = k;
  s.keep_all = keep_all;
  s.embedding_entry = 0;
  s.first_layer_entry = 1;
  s.final_norm_entry = layers + 1;
  s.lm_head_entry = layers + 2;
  return s;
}

TEST(StepScheduleTest, FiveLayersIntervalTwo) {
  const auto ops = BuildStepSchedule(Shape(5, 2, false));
  EXPECT_EQ(Names(ops), (std::vector<std::string>{
                            "embed.fwd", "layer.fwd.0", "layer.fwd.1", "layer.fwd.2", "layer.fwd.3",
                            "layer.fwd.4", "head", "layer.bwd.4", "layer.recompute.2",
                            "layer.recompute.3", "layer.bwd.3", "layer.bwd.2", "layer.recompute.0",
                            "layer.recompute.1", "layer.bwd.1", "layer.bwd.0", "embed.bwd"}));
  EXPECT_EQ(CheckpointCount(Shape(5, 2, false)), 2);  // not the top block's
  EXPECT_EQ(ActivationSetCount(Shape(5, 2, false)), 2);
}

TEST(StepScheduleTest, EmbeddingStagesRunOnTheHostWithoutASlot) {
  for (const auto& ops :
       {BuildStepSchedule(Shape(3, 2, false)), BuildEvalSchedule(Shape(3, 2, false))}) {
    for (const auto& op : ops) {
      const bool embed =
          op.kind == StageKind::kEmbedForward || op.kind == StageKind::kEmbedBackward;
      EXPECT_EQ(op.host_entry, embed ? 0 : -1) << DescribeOp(op);
      EXPECT_EQ(op.entries.empty(), embed) << DescribeOp(op);
      if (embed) {
        EXPECT_FALSE(op.produces_gradients) << DescribeOp(op);
      }
    }
  }
}

TEST(StepScheduleTest, KeepAllRecomputesNothing) {
  const auto ops = BuildStepSchedule(Shape(3, 4, true));
  EXPECT_EQ(Names(ops), (std::vector<std::string>{"embed.fwd", "layer.fwd.0", "layer.fwd.1",
                                                  "layer.fwd.2", "head", "layer.bwd.2",
                                                  "layer.bwd.1", "layer.bwd.0", "embed.bwd"}));
  EXPECT_EQ(ActivationSetCount(Shape(3, 4, true)), 3);
}

TEST(StepScheduleTest, EveryBackwardReadsTheSetItsLatestForwardSaved) {
  for (int layers : {1, 2, 3, 4, 7, 8, 9}) {
    for (int k : {1, 2, 3, 4}) {
      for (bool keep_all : {false, true}) {
        const auto ops = BuildStepSchedule(Shape(layers, k, keep_all));
        std::map<int, int> set_holds_layer;  // activation set -> layer it holds
        int backward_count = 0;
        for (const auto& op : ops) {
          if (op.kind == StageKind::kLayerForward && op.save_activations) {
            set_holds_layer[op.activation_set] = op.layer;
          }
          if (op.kind == StageKind::kLayerBackward) {
            ASSERT_EQ(set_holds_layer.at(op.activation_set), op.layer)
                << "layers=" << layers << " k=" << k;
            ++backward_count;
          }
        }
        EXPECT_EQ(backward_count, layers);
        EXPECT_LE(static_cast<int>(set_holds_layer.size()),
                  ActivationSetCount(Shape(layers, k, keep_all)));
      }
    }
  }
}

ScheduleShape ShapeWithModes(int layers, int k, std::vector<ActivationMode> modes) {
  ScheduleShape s = Shape(layers, k, false);
  s.block_modes = std::move(modes);
  return s;
}

constexpr ActivationMode kR = ActivationMode::kRecompute;
constexpr ActivationMode kK = ActivationMode::kKeep;
constexpr ActivationMode kO = ActivationMode::kOffload;

TEST(StepScheduleTest, MixedModesOpOrderSetsAndCopies) {
  // 7 layers, k = 2: blocks [0,2) offload, [2,4) keep, [4,6) recompute, [6] top.
  const ScheduleShape shape = ShapeWithModes(7, 2, {kO, kK, kR});
  const auto ops = BuildStepSchedule(shape);
  EXPECT_EQ(Names(ops),
            (std::vector<std::string>{
                "embed.fwd", "layer.fwd.0", "layer.fwd.1", "layer.fwd.2", "layer.fwd.3",
                "layer.fwd.4", "layer.fwd.5", "layer.fwd.6", "head", "layer.bwd.6",
                "layer.recompute.4", "layer.recompute.5", "layer.bwd.5", "layer.bwd.4",
                "layer.bwd.3", "layer.bwd.2", "layer.bwd.1", "layer.bwd.0", "embed.bwd"}));
  EXPECT_EQ(ActivationSetCount(shape), 4);  // 2 working + 2 for the kept block
  EXPECT_EQ(CheckpointCount(shape), 3);     // by block below the top, whatever the modes
  std::map<std::string, const ScheduledOp*> by_name;
  for (const auto& op : ops) by_name[DescribeOp(op)] = &op;
  // Offloaded layers save into working sets and go out; no checkpoint.
  EXPECT_TRUE(by_name["layer.fwd.0"]->offload_activations);
  EXPECT_EQ(by_name["layer.fwd.0"]->activation_set, 0);
  EXPECT_EQ(by_name["layer.fwd.0"]->checkpoint, -1);
  EXPECT_EQ(by_name["layer.fwd.1"]->activation_set, 1);
  // Kept layers save into their own sets.
  EXPECT_EQ(by_name["layer.fwd.2"]->activation_set, 2);
  EXPECT_EQ(by_name["layer.fwd.3"]->activation_set, 3);
  EXPECT_FALSE(by_name["layer.fwd.2"]->offload_activations);
  EXPECT_EQ(by_name["layer.bwd.3"]->activation_set, 3);
  // The recomputed block saves nothing in the first forward, keeps its checkpoint.
  EXPECT_FALSE(by_name["layer.fwd.4"]->save_activations);
  EXPECT_EQ(by_name["layer.fwd.4"]->checkpoint, 2);
  // Fetches start when the working set is free: after the recomputed block's
  // backward of the layer that used the same set.
  EXPECT_EQ(by_name["layer.bwd.5"]->fetch_after, (std::vector<ActivationFetch>{{1, 1}}));
  EXPECT_EQ(by_name["layer.bwd.4"]->fetch_after, (std::vector<ActivationFetch>{{0, 0}}));
  EXPECT_TRUE(by_name["layer.bwd.1"]->fetched_activations);
  EXPECT_TRUE(by_name["layer.bwd.0"]->fetched_activations);
  EXPECT_FALSE(by_name["layer.bwd.3"]->fetched_activations);
  int copies_out = 0, fetches = 0;
  for (const auto& op : ops) {
    copies_out += op.offload_activations ? 1 : 0;
    fetches += static_cast<int>(op.fetch_after.size());
  }
  EXPECT_EQ(copies_out, 2);
  EXPECT_EQ(fetches, 2);
}

TEST(StepScheduleTest, AllRecomputeModesEqualTheDefault) {
  const auto plain = BuildStepSchedule(Shape(9, 2, false));
  const auto moded = BuildStepSchedule(ShapeWithModes(9, 2, {kR, kR, kR, kR}));
  EXPECT_EQ(Names(plain), Names(moded));
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].activation_set, moded[i].activation_set);
    EXPECT_EQ(plain[i].checkpoint, moded[i].checkpoint);
    EXPECT_TRUE(moded[i].fetch_after.empty());
  }
}

TEST(StepScheduleTest, OffloadBelowAPartialTopFetchesRightAfterItsOwnForward) {
  // 6 layers, k = 4: the top block [4,6) uses sets 0 and 1 only, so sets 2
  // and 3 of the offloaded block are untouched until its backward.
  const auto ops = BuildStepSchedule(ShapeWithModes(6, 4, {kO}));
  for (const auto& op : ops) {
    if (op.kind == StageKind::kLayerForward && (op.layer == 2 || op.layer == 3)) {
      EXPECT_EQ(op.fetch_after, (std::vector<ActivationFetch>{{op.layer, op.layer}}));
    }
  }
}

// Simulates what each set and each host copy holds through every mode mix and
// checks every backward reads its own layer's activations, each fetch reads a
// copy that went out before, and at most ActivationSetCount sets are used.
TEST(StepScheduleTest, EveryModeMixFeedsEachBackwardItsOwnActivations) {
  for (int layers : {1, 2, 3, 5, 7, 8}) {
    for (int k : {1, 2, 3}) {
      const int blocks = (layers + k - 1) / k;
      int mixes = 1;
      for (int b = 0; b + 1 < blocks; ++b) mixes *= 3;
      for (int mix = 0; mix < mixes; ++mix) {
        std::vector<ActivationMode> modes;
        for (int b = 0, m = mix; b + 1 < blocks; ++b, m /= 3) {
          modes.push_back(m % 3 == 0 ? kR : m % 3 == 1 ? kK : kO);
        }
        const ScheduleShape shape = ShapeWithModes(layers, k, modes);
        const auto ops = BuildStepSchedule(shape);
        const std::string where = "layers=" + std::to_string(layers) + " k=" + std::to_string(k) +
                                  " mix=" + std::to_string(mix);
        std::map<int, int> set_holds;  // set -> layer (-1 scratch)
        std::map<int, bool> on_host;   // layer -> copy is on the host
        int backward_count = 0, max_set = -1;
        for (const auto& op : ops) {
          if (op.kind == StageKind::kLayerForward) {
            const int set = op.save_activations ? op.activation_set : 0;
            set_holds[set] = op.save_activations ? op.layer : -1;
            max_set = std::max(max_set, set);
            if (op.recompute) {
              EXPECT_EQ(BlockMode(shape, op.layer / k), kR) << where;
            }
            if (op.offload_activations) on_host[op.layer] = true;
          }
          if (op.kind == StageKind::kLayerBackward) {
            ASSERT_EQ(set_holds[op.activation_set], op.layer) << where << " " << DescribeOp(op);
            EXPECT_EQ(op.fetched_activations, BlockMode(shape, op.layer / k) == kO) << where;
            ++backward_count;
          }
          for (const ActivationFetch& f : op.fetch_after) {
            ASSERT_TRUE(on_host[f.layer]) << where;
            set_holds[f.set] = f.layer;
          }
        }
        EXPECT_EQ(backward_count, layers) << where;
        EXPECT_LT(max_set, ActivationSetCount(shape)) << where;
      }
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
