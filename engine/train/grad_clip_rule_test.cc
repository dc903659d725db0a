// The clip rules: the planned coefficient, when it is applied, and the bound on the applied
// gradient's norm that both rules keep.
#include "engine/train/grad_clip_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/optimizer/grad_norm.h"

namespace megatrain::engine {
namespace {

TEST(GradClipRuleTest, NamesParseBackAndOthersAreRefused) {
  for (GradClipRule rule : {GradClipRule::kExact, GradClipRule::kPreviousNorm}) {
    EXPECT_EQ(*ParseGradClipRule(GradClipRuleName(rule)), rule);
  }
  const absl::StatusOr<GradClipRule> bad = ParseGradClipRule("stale");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "'stale' is not a clip rule (exact or previous_norm)");
}

TEST(GradClipRuleTest, NothingIsPlannedWithoutTheRuleAClipOrAPreviousNorm) {
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kExact, 1.0, 1.25, 10.0), 0.0);
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 0.0, 1.25, 10.0), 0.0);
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 1.0, 1.25, 0.0), 0.0);
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 1.0, 1.25,
                                   std::numeric_limits<double>::infinity()),
            0.0);
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 1.0, 1.25, 8.0),
            ClipCoefficient(10.0, 1.0));
  // A previous step that did not clip plans nothing, even when headroom x its norm would clip.
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 1.0, 1.25, 0.5), 0.0);
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 1.0, 1.25, 0.95), 0.0);
}

TEST(GradClipRuleTest, ThePlanIsAppliedWhileItKeepsTheAppliedNormWithinTheClip) {
  const double clip = 1.0;
  const double planned = PlannedClipCoefficient(GradClipRule::kPreviousNorm, clip, 1.25, 20.0);
  // Clipped norms up to 25 (headroom x previous) take the plan; a larger one the exact
  // coefficient.
  for (double norm : {3.0, 19.0, 20.0, 24.9}) {
    EXPECT_EQ(AppliedClipCoefficient(clip, planned, norm), planned) << norm;
  }
  EXPECT_EQ(AppliedClipCoefficient(clip, planned, 30.0), ClipCoefficient(30.0, clip));
  // No plan (the first step, or the exact rule): exact.
  EXPECT_EQ(AppliedClipCoefficient(clip, 0.0, 30.0), ClipCoefficient(30.0, clip));
  EXPECT_EQ(AppliedClipCoefficient(clip, 0.0, 0.5), 1.0);
  // A step under the clip is not clipped, whatever was planned.
  EXPECT_EQ(AppliedClipCoefficient(clip, planned, 0.5), 1.0);
  // Clipping off: 1 whatever was planned.
  EXPECT_EQ(AppliedClipCoefficient(0.0, 0.5, 30.0), 1.0);
}

// The speculation runs with the plan (else 1) and stops once it cannot commit.
TEST(GradClipRuleTest, TheSpeculationRunsWithThePlanAndStopsWhenItCannotCommit) {
  EXPECT_EQ(SpeculatedClipCoefficient(0.0), 1.0);
  EXPECT_EQ(SpeculatedClipCoefficient(0.04), 0.04);
  const double inf = std::numeric_limits<double>::infinity();
  // No plan: it can commit while the bound does not clip.
  EXPECT_TRUE(SpeculationCanCommit(1.0, 0.0, 0.5));
  EXPECT_FALSE(SpeculationCanCommit(1.0, 0.0, 1.5));
  // A plan: while planned x bound stays within the clip.
  EXPECT_TRUE(SpeculationCanCommit(1.0, 0.04, 25.0));
  EXPECT_FALSE(SpeculationCanCommit(1.0, 0.04, 26.0));
  // Clipping off, or a non-finite bound: nothing to stop on.
  EXPECT_TRUE(SpeculationCanCommit(0.0, 0.0, 1e9));
  EXPECT_TRUE(SpeculationCanCommit(1.0, 0.04, inf));
}

// Over a sweep of previous and current norms, the applied gradient's norm never exceeds the
// clip (exact clipping's own bound: clip x norm / (norm + 1e-6)), and a step exact clipping
// leaves alone is left alone.
TEST(GradClipRuleTest, TheAppliedNormNeverExceedsTheClip) {
  const double clip = 1.0;
  for (double previous = 0.01; previous < 100; previous *= 1.37) {
    const double planned = PlannedClipCoefficient(GradClipRule::kPreviousNorm, clip,
                                                  kDefaultGradClipHeadroom, previous);
    for (double norm = 0.01; norm < 100; norm *= 1.29) {
      const double applied = AppliedClipCoefficient(clip, planned, norm);
      EXPECT_LE(applied * norm, clip) << previous << " then " << norm;
      if (ClipCoefficient(norm, clip) == 1.0) {
        EXPECT_EQ(applied, 1.0) << previous << " then " << norm;
      }
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
