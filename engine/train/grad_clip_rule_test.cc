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
  // A previous norm under clip / headroom plans no clipping.
  EXPECT_EQ(PlannedClipCoefficient(GradClipRule::kPreviousNorm, 1.0, 1.25, 0.5), 1.0);
}

TEST(GradClipRuleTest, ThePlanIsAppliedWhileItKeepsTheAppliedNormWithinTheClip) {
  const double clip = 1.0;
  const double planned = PlannedClipCoefficient(GradClipRule::kPreviousNorm, clip, 1.25, 20.0);
  // Norms up to 25 (headroom x previous) take the plan; a larger one the exact coefficient.
  for (double norm : {3.0, 19.0, 20.0, 24.9}) {
    EXPECT_EQ(AppliedClipCoefficient(clip, planned, norm), planned) << norm;
  }
  EXPECT_EQ(AppliedClipCoefficient(clip, planned, 30.0), ClipCoefficient(30.0, clip));
  // No plan (the first step, or the exact rule): exact.
  EXPECT_EQ(AppliedClipCoefficient(clip, 0.0, 30.0), ClipCoefficient(30.0, clip));
  EXPECT_EQ(AppliedClipCoefficient(clip, 0.0, 0.5), 1.0);
  // A plan of 1 is exact clipping's answer for norms under the clip, and not applied above it.
  EXPECT_EQ(AppliedClipCoefficient(clip, 1.0, 0.9), 1.0);
  EXPECT_EQ(AppliedClipCoefficient(clip, 1.0, 1.5), ClipCoefficient(1.5, clip));
  // Clipping off: 1 whatever was planned.
  EXPECT_EQ(AppliedClipCoefficient(0.0, 0.5, 30.0), 1.0);
}

// Over a sweep of previous and current norms, the applied gradient's norm never exceeds the
// clip (exact clipping's own bound: clip x norm / (norm + 1e-6)).
TEST(GradClipRuleTest, TheAppliedNormNeverExceedsTheClip) {
  const double clip = 1.0;
  for (double previous = 0.01; previous < 100; previous *= 1.37) {
    const double planned = PlannedClipCoefficient(GradClipRule::kPreviousNorm, clip,
                                                  kDefaultGradClipHeadroom, previous);
    for (double norm = 0.01; norm < 100; norm *= 1.29) {
      EXPECT_LE(AppliedClipCoefficient(clip, planned, norm) * norm, clip)
          << previous << " then " << norm;
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
