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
  EXPECT_EQ(CheckpointCount(Shape(5, 2, false)), 3);
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

}  // namespace
}  // namespace megatrain::engine
