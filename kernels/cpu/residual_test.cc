// Tests for the residual add.
#include "kernels/cpu/residual.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

TEST(ResidualTest, AddsInPlaceExactly) {
  const int64_t n = 13 * 37;
  const std::vector<float> x = testing::RandomFloats(n, 1);
  std::vector<float> y = testing::RandomFloats(n, 2);
  std::vector<float> expected = y;
  for (int64_t i = 0; i < n; ++i) expected[i] += x[i];  // one fp32 add: exact contract
  ResidualAdd(x.data(), n, y.data());
  EXPECT_TRUE(testing::BitwiseEqual(y, expected));
}

}  // namespace
}  // namespace megatrain::kernels::cpu
