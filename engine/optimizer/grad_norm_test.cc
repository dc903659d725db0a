// Tests for the gradient norm: the documented summation scheme, independence
// from thread count and SIMD width, accuracy, clip coefficient, non-finite.
#include "engine/optimizer/grad_norm.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

std::vector<float> RandomGrad(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-8.0f, 2.0f);
  std::vector<float> g(n);
  for (float& x : g) x = unit(rng) * std::pow(10.0f, exponent(rng));
  return g;
}

// The scheme of grad_norm.h, written out independently.
double DocumentedScheme(const std::vector<float>& g) {
  double total = 0.0;
  for (size_t begin = 0; begin < g.size(); begin += kGradNormChunkElements) {
    const size_t end = std::min(g.size(), begin + kGradNormChunkElements);
    double lanes[kGradNormLanes] = {};
    for (size_t i = begin; i < end; ++i) {
      lanes[(i - begin) % kGradNormLanes] += double(g[i]) * double(g[i]);
    }
    double chunk = 0.0;
    for (double lane : lanes) chunk += lane;
    total += chunk;
  }
  return total;
}

long double LongDoubleReference(const std::vector<float>& g) {
  long double sum = 0.0L;
  for (float x : g) sum += static_cast<long double>(x) * x;
  return sum;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

const size_t kSizes[] = {0, 1, 15, 17, 65536, 65537, 3 * 65536 + 5, 1000003};

TEST(GradNormTest, IdenticalBitsForAnyThreadCountAndIsa) {
  for (size_t n : kSizes) {
    const std::vector<float> g = RandomGrad(n, static_cast<uint32_t>(n + 1));
    const double want = DocumentedScheme(g);
    EXPECT_TRUE(SameBits(GradSumOfSquares(g, nullptr, SimdIsa::kScalar), want)) << n;
    for (SimdIsa isa : {SimdIsa::kScalar, SimdIsa::kAvx2, SimdIsa::kAvx512}) {
      if (!SimdIsaSupported(isa)) continue;
      for (size_t threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        const double got = GradSumOfSquares(g, &pool, isa);
        EXPECT_TRUE(SameBits(got, want))
            << "n=" << n << " isa=" << SimdIsaName(isa) << " threads=" << threads << " got " << got
            << " want " << want;
      }
    }
  }
}

TEST(GradNormTest, MatchesLongDoubleReference) {
  ThreadPool pool(2);
  for (size_t n : kSizes) {
    if (n == 0) continue;
    const std::vector<float> g = RandomGrad(n, static_cast<uint32_t>(7 * n));
    const long double ref = LongDoubleReference(g);
    const double got = GradSumOfSquares(g, &pool);
    EXPECT_LE(std::fabs(static_cast<long double>(got) - ref), 1e-12L * ref) << "n=" << n;
  }
  // Same-sign, same-magnitude terms are the worst case for sequential sums.
  const std::vector<float> ones(4 * kGradNormChunkElements + 3, 0.1f);
  const long double ref = LongDoubleReference(ones);
  EXPECT_LE(std::fabs(static_cast<long double>(GradSumOfSquares(ones, &pool)) - ref), 1e-12L * ref);
}

TEST(GradNormTest, PiecesAtChunkBoundariesGiveTheWholeBuffersBits) {
  const std::vector<float> g = RandomGrad(5 * kGradNormChunkElements + 123, 9);
  const size_t n_chunks = 6;
  for (size_t piece_chunks : {size_t{1}, size_t{2}, size_t{4}}) {
    std::vector<double> partials(n_chunks, -1.0);
    const size_t piece = piece_chunks * kGradNormChunkElements;
    for (size_t first = 0; first < g.size(); first += piece) {
      const size_t n = std::min(piece, g.size() - first);
      GradChunkSumsOfSquares(absl::MakeConstSpan(g.data() + first, n), nullptr,
                             partials.data() + first / kGradNormChunkElements);
    }
    EXPECT_TRUE(SameBits(SumPartials(partials), GradSumOfSquares(g, nullptr))) << piece_chunks;
    EXPECT_TRUE(SameBits(SumPartials(partials), DocumentedScheme(g))) << piece_chunks;
  }
}

TEST(GradNormTest, EmptyIsZero) { EXPECT_EQ(GradSumOfSquares({}, nullptr), 0.0); }

TEST(GradNormTest, GlobalNormAddsLayersInOrder) {
  ThreadPool pool(2);
  const std::vector<float> a = RandomGrad(70001, 1), b = RandomGrad(33, 2), c = RandomGrad(5, 3);
  const std::vector<double> sums = {GradSumOfSquares(a, &pool), GradSumOfSquares(b, &pool),
                                    GradSumOfSquares(c, &pool)};
  EXPECT_TRUE(SameBits(GlobalGradNorm(sums), std::sqrt((sums[0] + sums[1]) + sums[2])));
  const long double ref =
      std::sqrt(LongDoubleReference(a) + LongDoubleReference(b) + LongDoubleReference(c));
  EXPECT_LE(std::fabs(static_cast<long double>(GlobalGradNorm(sums)) - ref), 1e-12L * ref);
  EXPECT_EQ(GlobalGradNorm({}), 0.0);
  EXPECT_EQ(GlobalGradNorm({9.0, 16.0}), 5.0);
}

TEST(GradNormTest, ClipCoefficientFollowsTorch) {
  EXPECT_EQ(ClipCoefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_EQ(ClipCoefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(ClipCoefficient(0.0, 1.0), 1.0);
  EXPECT_LT(ClipCoefficient(1.0, 1.0), 1.0);  // the 1e-6 clips a norm equal to max_norm, barely
  EXPECT_EQ(ClipCoefficient(4.0, 2.0), 2.0 / (4.0 + 1e-6));
}

TEST(GradNormTest, NonFiniteGradientsAreDetected) {
  ThreadPool pool(2);
  std::vector<float> g = RandomGrad(200003, 4);
  EXPECT_TRUE(GradNormIsFinite(GlobalGradNorm({GradSumOfSquares(g, &pool)})));
  g[123457] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(GradNormIsFinite(GlobalGradNorm({GradSumOfSquares(g, &pool)})));
  g[123457] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(GradNormIsFinite(GlobalGradNorm({GradSumOfSquares(g, &pool)})));
  g[123457] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(GradNormIsFinite(GlobalGradNorm({GradSumOfSquares(g, &pool)})));
  g[123457] = 0.0f;
  g[200002] = std::numeric_limits<float>::quiet_NaN();  // in the scalar tail
  EXPECT_FALSE(GradNormIsFinite(GlobalGradNorm({GradSumOfSquares(g, &pool)})));
  // The largest finite floats square without overflowing the double sum.
  std::vector<float> big(1001, std::numeric_limits<float>::max());
  EXPECT_TRUE(GradNormIsFinite(GlobalGradNorm({GradSumOfSquares(big, &pool)})));
}

}  // namespace
}  // namespace megatrain::engine
