// Tests of the drive-wear judgement: per run, per day of continuous training, off by default.
#include "engine/planner/drive_wear.h"

#include <gtest/gtest.h>

namespace megatrain::engine::planner {
namespace {

constexpr uint64_t kTB = uint64_t{1000} * 1000 * 1000 * 1000;
constexpr uint64_t kGB = uint64_t{1000} * 1000 * 1000;

TEST(DriveWearTest, OffByDefault) {
  const DriveWear w = EvaluateDriveWear({}, 100 * kGB, 1'000'000, 10);
  EXPECT_EQ(w.written_per_run, 100'000'000 * kGB);
  EXPECT_DOUBLE_EQ(w.written_per_day, 100 * kGB * 8640.0);
  EXPECT_TRUE(w.warning.empty());
  EXPECT_EQ(DriveWearText({}, w).find("drive wear"), std::string::npos);
}

TEST(DriveWearTest, RunOverTheShareWarns) {
  DriveWearLimit limit;
  limit.rated_tbw_bytes = 1000 * kTB;                         // 100 TB at the default 10%
  DriveWear w = EvaluateDriveWear(limit, 20 * kGB, 5000, 0);  // 100 TB: not more than the share
  EXPECT_DOUBLE_EQ(w.share_of_tbw, 0.1);
  EXPECT_TRUE(w.warning.empty());
  w = EvaluateDriveWear(limit, 20 * kGB, 5001, 0);
  EXPECT_NE(w.warning.find("5001 steps"), std::string::npos) << w.warning;
  EXPECT_NE(DriveWearText(limit, w).find("WARNING drive wear"), std::string::npos);
}

TEST(DriveWearTest, OpenEndedRunIsJudgedPerDay) {
  DriveWearLimit limit;
  limit.rated_tbw_bytes = 1000 * kTB;
  limit.warn_share = 0.01;  // 10 TB
  // 20 GB every 100 s: 17.28 TB a day.
  DriveWear w = EvaluateDriveWear(limit, 20 * kGB, 0, 100);
  EXPECT_NEAR(w.written_per_day, 17.28e12, 1);
  EXPECT_NEAR(w.days_to_warn_share, 10.0 / 17.28, 1e-9);
  EXPECT_NE(w.warning.find("a day of continuous training"), std::string::npos) << w.warning;
  // Every 200 s: 8.64 TB a day, under the share.
  w = EvaluateDriveWear(limit, 20 * kGB, 0, 200);
  EXPECT_TRUE(w.warning.empty());
  EXPECT_NE(DriveWearText(limit, w).find("per day"), std::string::npos);
  // No step time, no steps: nothing to judge.
  EXPECT_TRUE(EvaluateDriveWear(limit, 20 * kGB, 0, 0).warning.empty());
}

// Ranks of one job on one machine share its drive: the share and the warning count all of them,
// the per-step and per-run bytes stay one rank's.
TEST(DriveWearTest, RanksSharingTheDriveAddUp) {
  DriveWearLimit limit;
  limit.rated_tbw_bytes = 1000 * kTB;  // 100 TB at the default 10%
  // 20 GB x 2600 steps = 52 TB per rank: one rank is under the share, two are over.
  EXPECT_TRUE(EvaluateDriveWear(limit, 20 * kGB, 2600, 0).warning.empty());
  DriveWear w = EvaluateDriveWear(limit, 20 * kGB, 2600, 0, /*writers=*/2);
  EXPECT_EQ(w.written_per_run, 52 * kTB);
  EXPECT_DOUBLE_EQ(w.share_of_tbw, 0.104);
  EXPECT_NE(w.warning.find("104.0 TB to NVMe (2 ranks x 2600 steps x 20.00 GB)"), std::string::npos)
      << w.warning;
  EXPECT_NE(DriveWearText(limit, w).find("(2600 steps, per rank)"), std::string::npos);
  // Per day: 2 x 20 GB every 100 s is 34.56 TB.
  w = EvaluateDriveWear(limit, 20 * kGB, 0, 100, /*writers=*/2);
  EXPECT_NEAR(w.written_per_day, 34.56e12, 1);
  EXPECT_NE(DriveWearText(limit, w).find("the 2 ranks sharing the drive"), std::string::npos);
  // Fewer than one writer is one.
  EXPECT_EQ(EvaluateDriveWear(limit, 20 * kGB, 0, 100, 0).writers, 1);
}

TEST(DriveWearTest, NothingWrittenNeverWarns) {
  DriveWearLimit limit;
  limit.rated_tbw_bytes = 1;
  EXPECT_TRUE(EvaluateDriveWear(limit, 0, 1000, 1).warning.empty());
}

TEST(DriveWearTest, ShareOutsideTheUnitIntervalIsRefusedByName) {
  DriveWearLimit limit;
  limit.rated_tbw_bytes = kTB;
  limit.warn_share = 0;
  EXPECT_NE(ValidateDriveWearLimit(limit, "daemon config ")
                .message()
                .find("daemon config nvme_wear_warn_share=0"),
            std::string::npos);
  limit.warn_share = 1;
  EXPECT_TRUE(ValidateDriveWearLimit(limit).ok());
}

}  // namespace
}  // namespace megatrain::engine::planner
