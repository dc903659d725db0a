// Tests for RMSNorm forward and backward against a double reference and finite differences.
#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;

constexpr int64_t kRows = 13;
constexpr int64_t kDim = 37;
constexpr double kEps = 1e-5;

struct Reference {
  std::vector<double> y, rstd;
};

Reference ForwardRef(const std::vector<double>& x, const std::vector<double>& w) {
  Reference ref{std::vector<double>(kRows * kDim), std::vector<double>(kRows)};
  for (int64_t r = 0; r < kRows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < kDim; ++i) ss += x[r * kDim + i] * x[r * kDim + i];
    ref.rstd[r] = 1.0 / std::sqrt(ss / kDim + kEps);
    for (int64_t i = 0; i < kDim; ++i) ref.y[r * kDim + i] = x[r * kDim + i] * ref.rstd[r] * w[i];
  }
  return ref;
}

// Analytic gradients of sum(y * dy).
void BackwardRef(const std::vector<double>& x, const std::vector<double>& w,
                 const std::vector<double>& dy, std::vector<double>* dx, std::vector<double>* dw) {
  const Reference ref = ForwardRef(x, w);
  dx->assign(kRows * kDim, 0.0);
  dw->assign(kDim, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    const double rstd = ref.rstd[r];
    double dot = 0.0;
    for (int64_t i = 0; i < kDim; ++i) dot += w[i] * dy[r * kDim + i] * x[r * kDim + i];
    for (int64_t i = 0; i < kDim; ++i) {
      const int64_t k = r * kDim + i;
      (*dx)[k] = rstd * (w[i] * dy[k] - x[k] * rstd * rstd * dot / kDim);
      (*dw)[i] += dy[k] * x[k] * rstd;
    }
  }
}

double Objective(const std::vector<double>& x, const std::vector<double>& w,
                 const std::vector<double>& dy) {
  const Reference ref = ForwardRef(x, w);
  double sum = 0.0;
  for (size_t k = 0; k < ref.y.size(); ++k) sum += ref.y[k] * dy[k];
  return sum;
}

TEST(RmsnormTest, ForwardMatchesDouble) {
  const std::vector<float> x = RandomFloats(kRows * kDim, 1, -2.0f, 2.0f);
  const std::vector<float> w = RandomFloats(kDim, 2, 0.5f, 1.5f);
  std::vector<float> y(kRows * kDim);
  std::vector<float> rstd(kRows);
  RmsnormForward(x.data(), w.data(), kRows, kDim, static_cast<float>(kEps), y.data(), rstd.data());
  const Reference ref = ForwardRef(testing::ToDouble(x), testing::ToDouble(w));
  // fp32 sum of 37 squares then rsqrt: relative error a few 1e-7; 1e-5 rel + 1e-6 abs.
  EXPECT_TRUE(AllClose(rstd, ref.rstd, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose(y, ref.y, 1e-6, 1e-5));
}

TEST(RmsnormTest, BackwardAccumulatesAndMatchesDouble) {
  const std::vector<float> x = RandomFloats(kRows * kDim, 3, -2.0f, 2.0f);
  const std::vector<float> w = RandomFloats(kDim, 4, 0.5f, 1.5f);
  const std::vector<float> dy = RandomFloats(kRows * kDim, 5);
  std::vector<float> y(kRows * kDim);
  std::vector<float> rstd(kRows);
  RmsnormForward(x.data(), w.data(), kRows, kDim, static_cast<float>(kEps), y.data(), rstd.data());
  const std::vector<float> dx0 = RandomFloats(kRows * kDim, 6);
  const std::vector<float> dw0 = RandomFloats(kDim, 7);
  std::vector<float> dx = dx0;
  std::vector<float> dw = dw0;
  RmsnormBackward(dy.data(), x.data(), w.data(), rstd.data(), kRows, kDim, dx.data(), dw.data());

  std::vector<double> want_dx, want_dw;
  BackwardRef(testing::ToDouble(x), testing::ToDouble(w), testing::ToDouble(dy), &want_dx,
              &want_dw);
  for (size_t k = 0; k < want_dx.size(); ++k) want_dx[k] += dx0[k];
  for (size_t k = 0; k < want_dw.size(); ++k) want_dw[k] += dw0[k];
  // dx: a dot of 37 terms per row (1e-5 abs covers sqrt(37) * 1e-6 scaled values);
  // dw: 13 rows summed in fp32, values O(1): 2e-5 abs.
  EXPECT_TRUE(AllClose(dx, want_dx, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(dw, want_dw, 2e-5, 1e-5));
}

TEST(RmsnormTest, ReferenceBackwardMatchesFiniteDifference) {
  std::vector<double> x = testing::ToDouble(RandomFloats(kRows * kDim, 8, -2.0f, 2.0f));
  std::vector<double> w = testing::ToDouble(RandomFloats(kDim, 9, 0.5f, 1.5f));
  const std::vector<double> dy = testing::ToDouble(RandomFloats(kRows * kDim, 10));
  std::vector<double> dx, dw;
  BackwardRef(x, w, dy, &dx, &dw);
  const double step = 1e-6;  // central difference: truncation O(step^2), roundoff ~1e-10
  for (int64_t k = 0; k < kRows * kDim; k += 7) {
    const double saved = x[k];
    x[k] = saved + step;
    const double plus = Objective(x, w, dy);
    x[k] = saved - step;
    const double minus = Objective(x, w, dy);
    x[k] = saved;
    EXPECT_NEAR(dx[k], (plus - minus) / (2 * step), 1e-7) << k;
  }
  for (int64_t i = 0; i < kDim; ++i) {
    const double saved = w[i];
    w[i] = saved + step;
    const double plus = Objective(x, w, dy);
    w[i] = saved - step;
    const double minus = Objective(x, w, dy);
    w[i] = saved;
    EXPECT_NEAR(dw[i], (plus - minus) / (2 * step), 1e-7) << i;
  }
}

TEST(RmsnormTest, Deterministic) {
  const std::vector<float> x = RandomFloats(kRows * kDim, 11, -2.0f, 2.0f);
  const std::vector<float> w = RandomFloats(kDim, 12, 0.5f, 1.5f);
  const std::vector<float> dy = RandomFloats(kRows * kDim, 13);
  std::vector<float> runs[2][2];  // [run][dx, dw]
  for (auto& run : runs) {
    std::vector<float> y(kRows * kDim), rstd(kRows);
    RmsnormForward(x.data(), w.data(), kRows, kDim, 1e-5f, y.data(), rstd.data());
    run[0].assign(kRows * kDim, 0.0f);
    run[1].assign(kDim, 0.0f);
    RmsnormBackward(dy.data(), x.data(), w.data(), rstd.data(), kRows, kDim, run[0].data(),
                    run[1].data());
    run[0].insert(run[0].end(), y.begin(), y.end());
  }
  EXPECT_TRUE(testing::BitwiseEqual(runs[0][0], runs[1][0]));
  EXPECT_TRUE(testing::BitwiseEqual(runs[0][1], runs[1][1]));
}

}  // namespace
}  // namespace megatrain::kernels::cpu
