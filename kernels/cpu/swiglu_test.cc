// Tests for SwiGLU forward and backward against double references and finite differences.
#include "kernels/cpu/swiglu.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;

double SiluRef(double g) { return g / (1.0 + std::exp(-g)); }

constexpr int64_t kN = 13 * 37;

// Tolerance: per element a handful of fp32 ops on O(1..10) values, so
// abs 1e-6 + rel 1e-5 (a few ulp plus expf's error).
constexpr double kAbs = 1e-6;
constexpr double kRel = 1e-5;

TEST(SwigluTest, ForwardMatchesDouble) {
  const std::vector<float> gate = RandomFloats(kN, 1, -8.0f, 8.0f);
  const std::vector<float> up = RandomFloats(kN, 2, -2.0f, 2.0f);
  std::vector<float> out(kN);
  SwigluForward(gate.data(), up.data(), kN, out.data());
  std::vector<double> want(kN);
  for (int64_t i = 0; i < kN; ++i) want[i] = SiluRef(gate[i]) * up[i];
  EXPECT_TRUE(AllClose(out, want, kAbs, kRel));
}

TEST(SwigluTest, BackwardMatchesAnalyticAndFiniteDifference) {
  const std::vector<float> gate = RandomFloats(kN, 3, -8.0f, 8.0f);
  const std::vector<float> up = RandomFloats(kN, 4, -2.0f, 2.0f);
  const std::vector<float> dout = RandomFloats(kN, 5);
  std::vector<float> dgate(kN, 99.0f);
  std::vector<float> dup(kN, 99.0f);  // overwritten, not accumulated
  SwigluBackward(gate.data(), up.data(), dout.data(), kN, dgate.data(), dup.data());
  std::vector<double> want_dgate(kN);
  std::vector<double> want_dup(kN);
  for (int64_t i = 0; i < kN; ++i) {
    const double g = gate[i];
    const double s = 1.0 / (1.0 + std::exp(-g));
    want_dup[i] = SiluRef(g) * dout[i];
    want_dgate[i] = static_cast<double>(up[i]) * dout[i] * (s + g * s * (1.0 - s));
    // The analytic reference against a central difference in double (step 1e-5:
    // truncation ~1e-10, far below the kernel tolerance).
    const double step = 1e-5;
    const double fd_gate = (SiluRef(g + step) - SiluRef(g - step)) / (2 * step) * up[i] * dout[i];
    ASSERT_NEAR(want_dgate[i], fd_gate, 1e-8) << i;
  }
  EXPECT_TRUE(AllClose(dgate, want_dgate, kAbs, kRel));
  EXPECT_TRUE(AllClose(dup, want_dup, kAbs, kRel));
}

}  // namespace
}  // namespace megatrain::kernels::cpu
