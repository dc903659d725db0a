// Drive wear: the NVMe bytes a run writes against the drive's rated endurance (TBW), and the
// plan's warning when a run (or a day of continuous training) would use more than a given share.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace megatrain::engine::planner {

inline constexpr double kDefaultWearWarnShare = 0.10;

// Off when rated_tbw_bytes is 0. rated_tbw_bytes is the rated endurance of the drives the NVMe
// tier's directory is on, summed over the drives a striped (RAID 0) directory spreads writes over.
struct DriveWearLimit {
  uint64_t rated_tbw_bytes = 0;
  double warn_share = kDefaultWearWarnShare;  // in (0, 1]
  bool enabled() const { return rated_tbw_bytes > 0; }
};

// INVALID_ARGUMENT naming `<prefix>nvme_wear_warn_share` when the share is not in (0, 1].
absl::Status ValidateDriveWearLimit(const DriveWearLimit& limit, const std::string& prefix = "");

struct DriveWear {
  uint64_t written_per_step = 0;  // by one writer (a rank)
  // Ranks writing written_per_step each to the same drive (a job's ranks on one machine share its
  // NVMe directory): the day's bytes, the share and the warning are the drive's, all of theirs.
  int writers = 1;
  double written_per_day = 0;    // to the drive, at the predicted step time; 0 when none is
                                 // predicted
  uint64_t steps = 0;            // of the run; 0 = unknown (open-ended)
  uint64_t written_per_run = 0;  // by one writer: steps x written_per_step (0 when steps is 0)
  // With a limit: the share of the rated TBW the run uses (per day when steps is 0), the days of
  // continuous training until the warn share is used (0 without a step time), and the warning
  // (empty = none).
  double share_of_tbw = 0;
  double days_to_warn_share = 0;
  std::string warning;
};

// steps = 0: the run is judged by one day of continuous training (needs step_seconds > 0).
// `writers` (>= 1) ranks each write written_per_step to the drive every step.
DriveWear EvaluateDriveWear(const DriveWearLimit& limit, uint64_t written_per_step, uint64_t steps,
                            double step_seconds, int writers = 1);

// "drive wear: ..." lines for a plan's text (empty when nothing is written to NVMe).
std::string DriveWearText(const DriveWearLimit& limit, const DriveWear& wear);

}  // namespace megatrain::engine::planner
