// Tests slot placement: double buffering alternates, matching content is
// reused, and with enough slots every stage is copied once per version.
#include "engine/exec/weight_slot_policy.h"

#include <gtest/gtest.h>

namespace megatrain::engine {
namespace {

TEST(WeightSlotPolicyTest, TwoSlotsAlternateAndNeverEvictThePreviousOp) {
  WeightSlotPolicy p(2);
  int previous = -1;
  for (int layer = 0; layer < 6; ++layer) {
    const auto d = p.Place({layer}, 0);
    EXPECT_TRUE(d.copy);
    EXPECT_NE(d.slot, previous);
    previous = d.slot;
  }
}

TEST(WeightSlotPolicyTest, ReusesASlotThatStillHoldsTheWeights) {
  WeightSlotPolicy p(2);
  const auto a = p.Place({6}, 0);
  const auto b = p.Place({7}, 0);
  const auto again7 = p.Place({7}, 0);
  EXPECT_FALSE(again7.copy);
  EXPECT_EQ(again7.slot, b.slot);
  const auto again6 = p.Place({6}, 0);
  EXPECT_FALSE(again6.copy);
  EXPECT_EQ(again6.slot, a.slot);
}

TEST(WeightSlotPolicyTest, NewVersionForcesACopy) {
  WeightSlotPolicy p(3);
  EXPECT_TRUE(p.Place({1}, 0).copy);
  EXPECT_FALSE(p.Place({1}, 0).copy);
  EXPECT_TRUE(p.Place({1}, 1).copy);
}

TEST(WeightSlotPolicyTest, EnoughSlotsCopyEachStageOncePerVersion) {
  const std::vector<std::vector<int>> stages = {{0}, {1}, {2}, {3}, {4, 0}, {3}, {2}, {1}, {0}};
  const int n = DistinctStageCount(stages);
  EXPECT_EQ(n, 5);
  WeightSlotPolicy p(n);
  int copies = 0;
  for (int micro = 0; micro < 3; ++micro) {
    for (const auto& s : stages) copies += p.Place(s, 0).copy ? 1 : 0;
  }
  EXPECT_EQ(copies, 5);
}

}  // namespace
}  // namespace megatrain::engine
