// Tests the activation policy: a fast link offloads, a slow one recomputes,
// the budget sets how many blocks keep, drift re-decides and noise does not.
#include "engine/exec/activation_policy.h"

#include <gtest/gtest.h>

namespace megatrain::engine {
namespace {

constexpr ActivationMode kR = ActivationMode::kRecompute;
constexpr ActivationMode kK = ActivationMode::kKeep;
constexpr ActivationMode kO = ActivationMode::kOffload;

// 9 layers, k = 2: blocks [0,2) [2,4) [4,6) [6,8) and the top [8].
ActivationCosts Costs(int keep_capacity = 0) {
  ActivationCosts c;
  c.num_layers = 9;
  c.checkpoint_interval = 2;
  c.keep_capacity_blocks = keep_capacity;
  c.weight_bytes = 10e6;
  c.gradient_bytes = 10e6;
  c.activation_set_bytes = 20e6;
  return c;
}

ActivationMeasurement Link(double gbps, double forward_ms = 10) {
  ActivationMeasurement m;
  m.copy_in_bytes_per_second = gbps * 1e9;
  m.copy_out_bytes_per_second = gbps * 1e9;
  m.forward_seconds = forward_ms * 1e-3;
  m.backward_seconds = 2 * forward_ms * 1e-3;
  return m;
}

TEST(ActivationPolicyTest, FastLinkOffloadsEveryBlockBelowTheTop) {
  const ActivationDecision d =
      DecideActivationModes(ActivationPolicyKind::kAdaptive, Costs(), Link(100));
  EXPECT_EQ(d.modes(), (std::vector<ActivationMode>{kO, kO, kO, kO, kK}));
  EXPECT_GT(d.predicted_seconds, 0);
  EXPECT_NE(d.blocks[0].reason.find("offload: 2 x 20.0 MB"), std::string::npos)
      << d.blocks[0].reason;
  EXPECT_EQ(d.blocks[4].first_layer, 8);
  EXPECT_EQ(d.blocks[4].num_layers, 1);
}

TEST(ActivationPolicyTest, SlowLinkRecomputes) {
  const ActivationDecision d =
      DecideActivationModes(ActivationPolicyKind::kAdaptive, Costs(), Link(0.5));
  EXPECT_EQ(d.modes(), (std::vector<ActivationMode>{kR, kR, kR, kR, kK}));
  EXPECT_NE(d.blocks[1].reason.find("recompute: 2 x 10.00 ms"), std::string::npos)
      << d.blocks[1].reason;
}

TEST(ActivationPolicyTest, BudgetKeepsTheBlocksNearestTheTop) {
  const ActivationDecision d =
      DecideActivationModes(ActivationPolicyKind::kAdaptive, Costs(2), Link(0.5));
  EXPECT_EQ(d.modes(), (std::vector<ActivationMode>{kR, kR, kK, kK, kK}));
  const ActivationDecision all =
      DecideActivationModes(ActivationPolicyKind::kAdaptive, Costs(10), Link(0.5));
  EXPECT_EQ(all.modes(), (std::vector<ActivationMode>{kK, kK, kK, kK, kK}));
}

TEST(ActivationPolicyTest, FixedPoliciesIgnoreTheLinkButKeepWithinBudget) {
  for (double gbps : {0.5, 100.0}) {
    EXPECT_EQ(DecideActivationModes(ActivationPolicyKind::kRecompute, Costs(1), Link(gbps)).modes(),
              (std::vector<ActivationMode>{kR, kR, kR, kK, kK}));
    EXPECT_EQ(DecideActivationModes(ActivationPolicyKind::kOffload, Costs(1), Link(gbps)).modes(),
              (std::vector<ActivationMode>{kO, kO, kO, kK, kK}));
  }
}

TEST(ActivationPolicyTest, UnmeasuredAdaptiveStartsAsRecompute) {
  const ActivationDecision d =
      DecideActivationModes(ActivationPolicyKind::kAdaptive, Costs(), ActivationMeasurement{});
  EXPECT_EQ(d.modes(), (std::vector<ActivationMode>{kR, kR, kR, kR, kK}));
  EXPECT_NE(d.blocks[0].reason.find("no measurement yet"), std::string::npos);
}

TEST(ActivationPolicyTest, ModelChargesOffloadToTheLinkAndRecomputeToCompute) {
  const ActivationCosts c = Costs();
  const ActivationMeasurement m = Link(1);
  const double keep = PredictLayerSeconds(c, m, {kK, kK, kK, kK});
  const double offload = PredictLayerSeconds(c, m, {kO, kK, kK, kK});
  const double recompute = PredictLayerSeconds(c, m, {kR, kK, kK, kK});
  EXPECT_GT(offload, keep);
  EXPECT_GT(recompute, keep);
  // Doubling compute leaves a copy-bound offload cheaper than recompute.
  const ActivationMeasurement slow_compute = Link(1, 40);
  EXPECT_LT(PredictLayerSeconds(c, slow_compute, {kO, kK, kK, kK}),
            PredictLayerSeconds(c, slow_compute, {kR, kK, kK, kK}));
}

TEST(ActivationPolicyTest, BalancedLinkMixesModes) {
  // A link where copy_out keeps up with the forward for some offloaded blocks
  // (behind the recomputed blocks' compute) but not for all of them.
  ActivationCosts c = Costs();
  c.weight_bytes = 2e6;
  c.gradient_bytes = 2e6;
  const ActivationDecision d = DecideActivationModes(ActivationPolicyKind::kAdaptive, c, Link(1));
  const double offload_all = PredictLayerSeconds(c, Link(1), {kO, kO, kO, kO});
  const double recompute_all = PredictLayerSeconds(c, Link(1), {kR, kR, kR, kR});
  EXPECT_LE(d.predicted_seconds, offload_all);
  EXPECT_LE(d.predicted_seconds, recompute_all);
  int offloads = 0, recomputes = 0;
  for (ActivationMode mode : d.modes()) {
    offloads += mode == kO ? 1 : 0;
    recomputes += mode == kR ? 1 : 0;
  }
  EXPECT_GT(offloads, 0);
  EXPECT_GT(recomputes, 0);
  EXPECT_LT(d.predicted_seconds, std::min(offload_all, recompute_all));
}

TEST(ActivationPolicyTest, DriftReDecidesAndNoiseDoesNot) {
  ActivationPolicy policy(ActivationPolicyKind::kAdaptive, Costs(), 0.15);
  EXPECT_TRUE(policy.Observe(Link(100)));  // first measurement: offload
  EXPECT_EQ(policy.decision().modes()[0], kO);
  // 10% noise in every direction: no re-decision, same basis.
  ActivationMeasurement noisy = Link(90, 11);
  EXPECT_FALSE(policy.Observe(noisy));
  EXPECT_DOUBLE_EQ(policy.decision().basis.copy_in_bytes_per_second, 100e9);
  // Another process takes the link: recompute.
  EXPECT_TRUE(policy.Observe(Link(0.5)));
  EXPECT_EQ(policy.decision().modes()[0], kR);
  // A partial measurement (no out bandwidth) keeps the last value of the rest.
  ActivationMeasurement partial = Link(100);
  partial.copy_out_bytes_per_second = 0;
  policy.Observe(partial);
  EXPECT_DOUBLE_EQ(policy.decision().basis.copy_out_bytes_per_second, 0.5e9);
}

TEST(ActivationPolicyTest, ADriftThatBarelyFavoursOtherModesKeepsThem) {
  // On the balanced link of BalancedLinkMixesModes the best modes mix; from
  // all-offload (decided on a fast link) the switch happens only when the
  // predicted gain exceeds min_gain.
  ActivationCosts c = Costs();
  c.weight_bytes = 2e6;
  c.gradient_bytes = 2e6;
  const double kept = PredictLayerSeconds(c, Link(1), {kO, kO, kO, kO});
  const double best =
      DecideActivationModes(ActivationPolicyKind::kAdaptive, c, Link(1)).predicted_seconds;
  ASSERT_LT(best, kept);
  const double gain = 1 - best / kept;
  for (double min_gain : {gain / 2, gain * 2}) {
    ActivationPolicy policy(ActivationPolicyKind::kAdaptive, c, 0.15, min_gain);
    ASSERT_TRUE(policy.Observe(Link(100)));
    EXPECT_EQ(policy.decision().modes(), (std::vector<ActivationMode>{kO, kO, kO, kO, kK}));
    const bool switches = min_gain < gain;
    EXPECT_EQ(policy.Observe(Link(1)), switches) << min_gain;
    EXPECT_DOUBLE_EQ(policy.decision().basis.copy_in_bytes_per_second, 1e9);
    // A slow link gains a lot by recomputing: the modes change.
    EXPECT_TRUE(policy.Observe(Link(0.5)));
    EXPECT_EQ(policy.decision().modes()[0], kR);
  }
}

TEST(ActivationPolicyTest, DriftThresholdIsRelative) {
  const ActivationMeasurement base = Link(10);
  EXPECT_FALSE(MeasurementDrifted(base, Link(11), 0.15));
  EXPECT_TRUE(MeasurementDrifted(base, Link(12), 0.15));
  EXPECT_FALSE(MeasurementDrifted(base, ActivationMeasurement{}, 0.15));
  EXPECT_TRUE(MeasurementDrifted(ActivationMeasurement{}, base, 0.15));
}

TEST(ActivationPolicyTest, ParsesPolicyNames) {
  EXPECT_EQ(*ParseActivationPolicy("adaptive"), ActivationPolicyKind::kAdaptive);
  EXPECT_EQ(*ParseActivationPolicy("offload"), ActivationPolicyKind::kOffload);
  EXPECT_FALSE(ParseActivationPolicy("sometimes").ok());
}

}  // namespace
}  // namespace megatrain::engine
