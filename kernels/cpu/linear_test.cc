// Tests for the dense layer forward and backward against double references.
#include "kernels/cpu/linear.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;

constexpr int64_t kN = 13;
constexpr int64_t kIn = 37;
constexpr int64_t kOut = 29;

// fp32 GEMM against double: error grows with the reduction length K; values
// are in [-1, 1]: abs 1e-6 + 2e-7 * K (about 10x the observed error), plus
// 1e-6 rel for the accumulated base.
double GemmTol(int64_t k) { return 1e-6 + 2e-7 * static_cast<double>(k); }

TEST(LinearTest, ForwardWithAndWithoutBias) {
  const std::vector<float> x = RandomFloats(kN * kIn, 1);
  const std::vector<float> w = RandomFloats(kOut * kIn, 2);
  const std::vector<float> bias = RandomFloats(kOut, 3);
  for (const bool with_bias : {false, true}) {
    std::vector<float> y(kN * kOut, 123.0f);
    LinearForward(x.data(), w.data(), with_bias ? bias.data() : nullptr, kN, kIn, kOut, y.data());
    std::vector<double> want(kN * kOut);
    for (int64_t r = 0; r < kN; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        double sum = with_bias ? bias[o] : 0.0;
        for (int64_t i = 0; i < kIn; ++i) {
          sum += static_cast<double>(x[r * kIn + i]) * w[o * kIn + i];
        }
        want[r * kOut + o] = sum;
      }
    }
    EXPECT_TRUE(AllClose(y, want, GemmTol(kIn), 1e-6)) << "bias " << with_bias;
  }
}

TEST(LinearTest, BackwardOverwriteAndAccumulate) {
  const std::vector<float> x = RandomFloats(kN * kIn, 4);
  const std::vector<float> w = RandomFloats(kOut * kIn, 5);
  const std::vector<float> dy = RandomFloats(kN * kOut, 6);
  const std::vector<float> dx0 = RandomFloats(kN * kIn, 7);
  const std::vector<float> dw0 = RandomFloats(kOut * kIn, 8);
  const std::vector<float> db0 = RandomFloats(kOut, 9);

  std::vector<double> dx_ref(kN * kIn, 0.0), dw_ref(kOut * kIn, 0.0), db_ref(kOut, 0.0);
  for (int64_t r = 0; r < kN; ++r) {
    for (int64_t o = 0; o < kOut; ++o) {
      const double g = dy[r * kOut + o];
      db_ref[o] += g;
      for (int64_t i = 0; i < kIn; ++i) {
        dx_ref[r * kIn + i] += g * w[o * kIn + i];
        dw_ref[o * kIn + i] += g * x[r * kIn + i];
      }
    }
  }
  for (const GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate}) {
    std::vector<float> dx = dx0, dw = dw0, db = db0;
    LinearBackward(dy.data(), x.data(), w.data(), kN, kIn, kOut, dx.data(), mode, dw.data(),
                   db.data());
    std::vector<double> want_dx = dx_ref, want_dw = dw_ref, want_db = db_ref;
    for (size_t k = 0; k < want_dx.size(); ++k) {
      if (mode == GradMode::kAccumulate) want_dx[k] += dx0[k];
    }
    for (size_t k = 0; k < want_dw.size(); ++k) want_dw[k] += dw0[k];
    for (size_t k = 0; k < want_db.size(); ++k) want_db[k] += db0[k];
    EXPECT_TRUE(AllClose(dx, want_dx, GemmTol(kOut), 1e-6));
    EXPECT_TRUE(AllClose(dw, want_dw, GemmTol(kN), 1e-6));
    EXPECT_TRUE(AllClose(db, want_db, GemmTol(kN), 1e-6));
  }
}

TEST(LinearTest, NullGradientsAreSkippedAndRunsAreBitwiseEqual) {
  const std::vector<float> x = RandomFloats(kN * kIn, 10);
  const std::vector<float> w = RandomFloats(kOut * kIn, 11);
  const std::vector<float> dy = RandomFloats(kN * kOut, 12);
  std::vector<float> dw_a(kOut * kIn, 0.0f), dw_b(kOut * kIn, 0.0f);
  LinearBackward(dy.data(), x.data(), w.data(), kN, kIn, kOut, nullptr, GradMode::kOverwrite,
                 dw_a.data(), nullptr);
  LinearBackward(dy.data(), x.data(), w.data(), kN, kIn, kOut, nullptr, GradMode::kOverwrite,
                 dw_b.data(), nullptr);
  EXPECT_TRUE(testing::BitwiseEqual(dw_a, dw_b));
}

}  // namespace
}  // namespace megatrain::kernels::cpu
