// Tests for the RoPE table and the in-place rotation and its backward.
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;

constexpr int64_t kHeadDim = 10;
constexpr int64_t kHalf = kHeadDim / 2;
constexpr int64_t kHeads = 3;
constexpr int64_t kTokens = 13;
constexpr int64_t kMaxPositions = 41;
constexpr double kTheta = 10000.0;

// Packed sequences: positions restart and need not be sorted.
const std::vector<int32_t> kPositions = {0, 1, 2, 3, 4, 0, 1, 2, 40, 17, 5, 39, 8};

RopeTable MakeTable(const RopeScaling& scaling = {}) {
  absl::StatusOr<RopeTable> table = RopeTable::Create(kMaxPositions, kHeadDim, kTheta, scaling);
  EXPECT_TRUE(table.ok()) << table.status();
  return *std::move(table);
}

std::vector<double> RotateRef(const std::vector<float>& x, const RopeScaling& scaling,
                              bool inverse) {
  std::vector<double> out(x.size());
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t base = (t * kHeads + h) * kHeadDim;
      for (int64_t i = 0; i < kHalf; ++i) {
        const double angle =
            kPositions[t] * RopeInverseFrequency(static_cast<int>(i), kHeadDim, kTheta, scaling);
        const double c = std::cos(angle);
        const double s = inverse ? -std::sin(angle) : std::sin(angle);
        const double lo = x[base + i];
        const double hi = x[base + i + kHalf];
        out[base + i] = lo * c - hi * s;
        out[base + i + kHalf] = hi * c + lo * s;
      }
    }
  }
  return out;
}

TEST(RopeTest, CreateRejectsBadArguments) {
  EXPECT_FALSE(RopeTable::Create(10, 7, kTheta, {}).ok());
  EXPECT_FALSE(RopeTable::Create(10, 0, kTheta, {}).ok());
  EXPECT_FALSE(RopeTable::Create(0, 8, kTheta, {}).ok());
  EXPECT_FALSE(RopeTable::Create(10, 8, 0.0, {}).ok());
  const absl::Status status = RopeTable::Create(10, 7, kTheta, {}).status();
  EXPECT_NE(status.message().find("head_dim"), std::string::npos) << status;
}

TEST(RopeTest, TableIsCosSinOfPositionTimesInverseFrequency) {
  RopeScaling llama3;
  llama3.factor = 8.0;
  llama3.original_max_position_embeddings = 16.0;  // small, so all three llama3 bands occur
  for (const RopeScaling& scaling : {RopeScaling{}, llama3}) {
    const RopeTable table = MakeTable(scaling);
    for (int64_t pos = 0; pos < kMaxPositions; ++pos) {
      for (int64_t i = 0; i < kHalf; ++i) {
        const double angle =
            pos * RopeInverseFrequency(static_cast<int>(i), kHeadDim, kTheta, scaling);
        // Rounded once from double: within half an ulp of values <= 1.
        EXPECT_NEAR(table.cos_row(pos)[i], std::cos(angle), 6e-8);
        EXPECT_NEAR(table.sin_row(pos)[i], std::sin(angle), 6e-8);
      }
    }
  }
}

TEST(RopeTest, ForwardAndBackwardMatchDouble) {
  RopeScaling llama3;
  llama3.factor = 8.0;
  llama3.original_max_position_embeddings = 16.0;
  for (const RopeScaling& scaling : {RopeScaling{}, llama3}) {
    const RopeTable table = MakeTable(scaling);
    const std::vector<float> x = RandomFloats(kTokens * kHeads * kHeadDim, 1);
    // Two products and an add on values <= 1 with table error <= 6e-8: 1e-6 abs.
    std::vector<float> y = x;
    RopeForward(table, kPositions.data(), kTokens, kHeads, y.data());
    EXPECT_TRUE(AllClose(y, RotateRef(x, scaling, false), 1e-6, 0.0));

    // The backward of a linear map is its transpose: the inverse rotation.
    std::vector<float> dx = x;
    RopeBackward(table, kPositions.data(), kTokens, kHeads, dx.data());
    EXPECT_TRUE(AllClose(dx, RotateRef(x, scaling, true), 1e-6, 0.0));

    // <R x, g> == <x, R^T g> in double on the fp32 results.
    const std::vector<float> g = RandomFloats(x.size(), 2);
    std::vector<float> rt_g = g;
    RopeBackward(table, kPositions.data(), kTokens, kHeads, rt_g.data());
    double lhs = 0.0, rhs = 0.0;
    for (size_t k = 0; k < x.size(); ++k) {
      lhs += static_cast<double>(y[k]) * g[k];
      rhs += static_cast<double>(x[k]) * rt_g[k];
    }
    EXPECT_NEAR(lhs, rhs, 1e-5);

    // Backward undoes forward.
    RopeBackward(table, kPositions.data(), kTokens, kHeads, y.data());
    EXPECT_TRUE(AllClose(y, testing::ToDouble(x), 1e-6, 0.0));
  }
}

}  // namespace
}  // namespace megatrain::kernels::cpu
