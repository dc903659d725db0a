// Tests for the warmup + cosine/constant learning-rate schedule.
#include "engine/train/lr_schedule.h"

#include <gtest/gtest.h>

namespace megatrain::engine {
namespace {

TEST(LrScheduleTest, WarmupIsLinearThenCosineReachesFloor) {
  LrScheduleOptions o{
      .peak_lr = 1e-3, .warmup_steps = 10, .cosine = true, .total_steps = 110, .min_lr_ratio = 0.1};
  ASSERT_TRUE(ValidateLrSchedule(o).ok());
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 1), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 10), 1e-3);
  EXPECT_NEAR(LearningRateAt(o, 60), 0.55e-3, 1e-12);  // halfway: mean of peak and floor
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 110), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 500), 1e-4);
  for (uint64_t s = 11; s < 110; ++s) EXPECT_GE(LearningRateAt(o, s), LearningRateAt(o, s + 1));
}

TEST(LrScheduleTest, ConstantAfterWarmup) {
  LrScheduleOptions o{.peak_lr = 2e-3, .warmup_steps = 0, .cosine = false, .total_steps = 5};
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 1), 2e-3);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 5000), 2e-3);
}

TEST(LrScheduleTest, RejectsNonFiniteAndNegativeNamingTheField) {
  LrScheduleOptions o;
  o.peak_lr = std::nan("");
  EXPECT_NE(ValidateLrSchedule(o).message().find("lr.peak_lr"), std::string::npos);
  o.peak_lr = 1e-3;
  o.min_lr_ratio = -1;
  EXPECT_NE(ValidateLrSchedule(o).message().find("lr.min_lr_ratio"), std::string::npos);
}

}  // namespace
}  // namespace megatrain::engine
