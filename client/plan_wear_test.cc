// Tests of `megatrain plan --nvme_rated_tbw`: the warning follows the command-line limit.
#include "client/plan_wear.h"

#include <gtest/gtest.h>

namespace megatrain::client {
namespace {

constexpr uint64_t kTB = uint64_t{1000} * 1000 * 1000 * 1000;

TEST(PlanWearTest, WarnsWhenTheRunExceedsTheShare) {
  v1::JobSpec spec;
  spec.mutable_hyper()->set_steps(3000);
  v1::PlanResponse plan;
  plan.set_nvme_written_bytes_per_step(17591076864);  // Qwen2.5-1.5B, 10 GiB budget: 52.8 TB/run
  plan.add_warnings("WARNING drive wear: the daemon's");
  plan.add_warnings("something else");
  engine::planner::DriveWearLimit limit;
  limit.rated_tbw_bytes = 600 * kTB;  // 10% = 60 TB: no warning
  ASSERT_TRUE(ApplyDriveWearLimit(spec, limit, plan).ok());
  EXPECT_EQ(plan.nvme_written_bytes_per_run(), 3000 * uint64_t{17591076864});
  ASSERT_EQ(plan.warnings_size(), 1);
  EXPECT_EQ(plan.warnings(0), "something else");
  limit.warn_share = 0.05;  // 30 TB
  ASSERT_TRUE(ApplyDriveWearLimit(spec, limit, plan).ok());
  ASSERT_EQ(plan.warnings_size(), 2);
  EXPECT_NE(plan.warnings(1).find("3000 steps"), std::string::npos) << plan.warnings(1);
}

// The plan's ranks on one machine write to the same drive: the limit counts them all.
TEST(PlanWearTest, CountsTheRanksOfOneMachine) {
  v1::JobSpec spec;
  spec.mutable_hyper()->set_steps(3000);
  v1::PlanResponse plan;
  plan.set_nvme_written_bytes_per_step(17591076864);  // 52.8 TB/run per rank
  plan.set_ranks_per_machine(2);                      // 105.5 TB on the drive
  engine::planner::DriveWearLimit limit;
  limit.rated_tbw_bytes = 600 * kTB;  // 10% = 60 TB: one rank would not warn
  ASSERT_TRUE(ApplyDriveWearLimit(spec, limit, plan).ok());
  EXPECT_EQ(plan.nvme_written_bytes_per_run(), 3000 * uint64_t{17591076864}) << "one rank's";
  ASSERT_EQ(plan.warnings_size(), 1);
  EXPECT_NE(plan.warnings(0).find("105.5 TB to NVMe (2 ranks x 3000 steps"), std::string::npos)
      << plan.warnings(0);
}

TEST(PlanWearTest, BadShareIsRefusedNamingTheFlag) {
  v1::JobSpec spec;
  v1::PlanResponse plan;
  engine::planner::DriveWearLimit limit;
  limit.rated_tbw_bytes = kTB;
  limit.warn_share = 2;
  absl::Status s = ApplyDriveWearLimit(spec, limit, plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--nvme_wear_warn_share=2"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace megatrain::client
