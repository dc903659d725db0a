// BoundedSeries: bounded size whatever the length, even spacing after halving, the newest
// sample always last, redone steps replace the old ones.
#include "server/bounded_series.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

struct Point {
  uint64_t s = 0;
  double value = 0;
  uint64_t step() const { return s; }
};

std::vector<uint64_t> Steps(const BoundedSeries<Point>& series) {
  std::vector<uint64_t> out;
  for (const Point& p : series.Samples()) out.push_back(p.step());
  return out;
}

TEST(BoundedSeriesTest, KeepsEveryStepUntilFull) {
  BoundedSeries<Point> series(8);
  for (uint64_t step = 1; step <= 7; ++step) series.Add({step, 0});
  EXPECT_EQ(Steps(series), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(series.stride(), 1u);
}

TEST(BoundedSeriesTest, MemoryIsBoundedAndSpacingEvenWhateverTheLength) {
  BoundedSeries<Point> series(16);
  for (uint64_t step = 1; step <= 100000; ++step) {
    series.Add({step, static_cast<double>(step)});
    ASSERT_LE(series.size(), 16u) << "at step " << step;
  }
  const std::vector<uint64_t> steps = Steps(series);
  ASSERT_GE(steps.size(), 8u);
  EXPECT_EQ(steps.front(), 1u);
  EXPECT_EQ(steps.back(), 100000u);  // the newest step is always there
  // Every kept sample but the newest is one stride after the previous one.
  for (size_t i = 1; i + 1 < steps.size(); ++i) {
    EXPECT_EQ(steps[i] - steps[i - 1], series.stride()) << "at " << i;
  }
  EXPECT_GT(series.stride(), 1000u);
  EXPECT_EQ(series.Last()->value, 100000.0);
}

TEST(BoundedSeriesTest, RedoneStepsReplaceTheOldOnes) {
  BoundedSeries<Point> series(64);
  for (uint64_t step = 1; step <= 10; ++step) series.Add({step, 1});
  // The run continued from the checkpoint of step 6: steps 7.. are redone.
  series.Add({7, 2});
  EXPECT_EQ(Steps(series), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(series.Last()->value, 2.0);
}

TEST(BoundedSeriesTest, EmptySeries) {
  BoundedSeries<Point> series(4);
  EXPECT_EQ(series.Last(), nullptr);
  EXPECT_TRUE(series.Samples().empty());
}

}  // namespace
}  // namespace megatrain::server
