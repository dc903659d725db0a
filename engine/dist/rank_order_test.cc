// The rank-ordered sum and owned ranges, and the world of one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/dist/communicator.h"

namespace megatrain::engine::dist {
namespace {

TEST(OwnedRangeTest, RangesTileTheArrayInRankOrder) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1001}}) {
    for (int world = 1; world <= 5; ++world) {
      size_t next = 0;
      for (int r = 0; r < world; ++r) {
        const OwnedRange range = OwnedRangeOf(n, r, world);
        EXPECT_EQ(range.begin, next) << "n=" << n << " world=" << world << " rank=" << r;
        EXPECT_LE(range.end - range.begin, n / world + 1);
        next = range.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(SumInRankOrderTest, AddsContributionsLeftToRight) {
  // Float addition is not associative: 1e8 + 1 - 1e8 = 0 left to right, 1 with the last two
  // first. The sum must be the left-to-right one.
  const std::vector<float> contributions = {1e8f, 3.0f, 1.0f, 0.5f, -1e8f, 2.0f};  // 3 x n=2
  std::vector<float> out(2);
  SumInRankOrder(contributions.data(), 3, 2, out.data());
  const float expected0 = (1e8f + 1.0f) + -1e8f;
  const float expected1 = (3.0f + 0.5f) + 2.0f;
  EXPECT_EQ(std::memcmp(&out[0], &expected0, sizeof(float)), 0) << out[0];
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], expected1);
}

TEST(SingleProcessCommunicatorTest, CollectivesAreTheIdentity) {
  SingleProcessCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(*c.SumInt64(-42), -42);
  const std::vector<double> v = {1.5, -2.25};
  EXPECT_EQ(*c.AllGatherDoubles(v), v);
  std::vector<float> data = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(c.ReduceFloatsInRankOrder(data.data(), data.size()).ok());
  EXPECT_EQ(data, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  int x = 7;
  EXPECT_TRUE(c.Broadcast(&x, sizeof(x), 0).ok());
  EXPECT_FALSE(c.Broadcast(&x, sizeof(x), 1).ok());
  EXPECT_TRUE(c.Barrier().ok());
}

TEST(SingleProcessCommunicatorTest, PairsAddTheApartArrayOnce) {
  // d_0 + a_0: an apart element of -0.0 (a row no token touched) leaves d exactly, -0.0 included.
  SingleProcessCommunicator c;
  std::vector<float> data = {1.0f, -0.0f, 2.0f, 1e8f};
  const std::vector<float> apart = {-0.0f, -0.0f, 0.5f, 1.0f};
  ASSERT_TRUE(c.ReduceFloatPairsInRankOrder(data.data(), apart.data(), data.size()).ok());
  const std::vector<float> expected = {1.0f, -0.0f, 2.5f, 1e8f + 1.0f};
  EXPECT_EQ(std::memcmp(data.data(), expected.data(), data.size() * sizeof(float)), 0);
  EXPECT_TRUE(std::signbit(data[1]));
  ASSERT_TRUE(c.ReduceFloatPairsInRankOrderTo(data.data(), apart.data(), data.size(), 0).ok());
  EXPECT_EQ(data[2], 3.0f);
  EXPECT_EQ(c.ReduceFloatPairsInRankOrderTo(data.data(), apart.data(), data.size(), 1).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace megatrain::engine::dist
