// The data-parallel step's helpers in a world of one and its slot arithmetic (the multi-rank
// behaviour is tested under mpirun in tests/dist).
#include "engine/train/data_parallel_step.h"

#include <gtest/gtest.h>

namespace megatrain::engine {
namespace {

TEST(RankSlotsTest, ContiguousSlotsPerRank) {
  EXPECT_EQ(RankSlotsOf(6, 0, 3)->first, 0);
  EXPECT_EQ(RankSlotsOf(6, 2, 3)->first, 4);
  EXPECT_EQ(RankSlotsOf(6, 2, 3)->count, 2);
  EXPECT_EQ(RankSlotsOf(2, 1, 2)->first, 1);
  EXPECT_EQ(RankSlotsOf(2, 1, 2)->count, 1);
  const absl::StatusOr<RankSlots> odd = RankSlotsOf(3, 0, 2);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("grad_accumulation=3"), std::string::npos);
  EXPECT_FALSE(RankSlotsOf(0, 0, 1).ok());
}

TEST(DataParallelStepTest, WorldOfOneKeepsCountsAndLossSums) {
  dist::SingleProcessCommunicator one;
  EXPECT_EQ(*GlobalValidTargets(one, 1234), 1234);
  const double loss = 0.1 + 0.2;
  EXPECT_EQ(*GlobalLossSum(one, loss), loss);
  EXPECT_EQ(*GlobalLossSum(one, -0.0), 0.0);
  EXPECT_TRUE(CheckSameJob(one, "{\"steps\": 4} from step 1").ok());
}

}  // namespace
}  // namespace megatrain::engine
