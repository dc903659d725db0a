// Tests for FastExp and the fixed-order reductions.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/ordered_sum.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::RandomFloats;

TEST(FastExpTest, MatchesExpWithinFewUlp) {
  // Relative 4e-7 (~3 ulp): the polynomial is within 2 ulp, plus rounding of r.
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(FastExp(x), want, 4e-7 * want) << "x=" << x;
  }
}

TEST(FastExpTest, EdgeValues) {
  EXPECT_EQ(FastExp(0.0f), 1.0f);
  EXPECT_EQ(FastExp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(FastExp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(FastExp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastExpTest, VectorisedLoopMatchesScalarCalls) {
  std::vector<float> values = RandomFloats(203, 7, -30.0f, 10.0f);
  std::vector<float> expected(values.size());
  float expected_sum = 0.0f;
  for (size_t i = 0; i < values.size(); ++i) expected[i] = FastExp(values[i] - 1.5f);
  const float sum_only = SumExpShifted(values.data(), static_cast<int64_t>(values.size()), 1.5f);
  const float sum =
      ExpShiftedInPlaceAndSum(values.data(), static_cast<int64_t>(values.size()), 1.5f);
  double want_sum = 0.0;
  for (float e : expected) want_sum += e;
  expected_sum = static_cast<float>(want_sum);
  EXPECT_TRUE(testing::BitwiseEqual(values, expected));
  EXPECT_NEAR(sum, expected_sum, 1e-6 * want_sum);
  EXPECT_EQ(sum_only, sum);  // same lanes, same order
}

TEST(OrderedSumTest, DotAndMaxMatchReference) {
  for (int64_t n : {0, 1, 15, 16, 17, 37, 100}) {
    const std::vector<float> a = RandomFloats(n, 1);
    const std::vector<float> b = RandomFloats(n, 2);
    const std::vector<float> c = RandomFloats(n, 3);
    double dot = 0.0;
    double dot3 = 0.0;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      dot3 += static_cast<double>(a[i]) * b[i] * c[i];
      max = std::max(max, a[i]);
    }
    // fp32 sums of n products of magnitude <= 1: 1e-6 * n covers the rounding.
    EXPECT_NEAR(OrderedDot(a.data(), b.data(), n), dot, 1e-6 * (n + 1)) << n;
    EXPECT_NEAR(OrderedDot3(a.data(), b.data(), c.data(), n), dot3, 1e-6 * (n + 1)) << n;
    EXPECT_EQ(RowMax(a.data(), n), max) << n;
  }
}

}  // namespace
}  // namespace megatrain::kernels::cpu
