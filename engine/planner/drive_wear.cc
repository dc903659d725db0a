// Drive wear against the rated TBW (see drive_wear.h).
#include "engine/planner/drive_wear.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace megatrain::engine::planner {

absl::Status ValidateDriveWearLimit(const DriveWearLimit& limit, const std::string& prefix) {
  if (!std::isfinite(limit.warn_share) || limit.warn_share <= 0 || limit.warn_share > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "nvme_wear_warn_share=", limit.warn_share, " must be in (0, 1]"));
  }
  return absl::OkStatus();
}

DriveWear EvaluateDriveWear(const DriveWearLimit& limit, uint64_t written_per_step, uint64_t steps,
                            double step_seconds, int writers) {
  DriveWear w;
  w.written_per_step = written_per_step;
  w.writers = std::max(1, writers);
  w.steps = steps;
  w.written_per_run = steps * written_per_step;
  const double drive_per_step = static_cast<double>(written_per_step) * w.writers;
  const double drive_per_run = static_cast<double>(w.written_per_run) * w.writers;
  if (step_seconds > 0) w.written_per_day = drive_per_step * (86400.0 / step_seconds);
  if (!limit.enabled() || written_per_step == 0) return w;
  const double tbw = static_cast<double>(limit.rated_tbw_bytes);
  const double allowed = limit.warn_share * tbw;
  if (w.written_per_day > 0) w.days_to_warn_share = allowed / w.written_per_day;
  // "3 ranks x " when several ranks write to the drive.
  const std::string ranks = w.writers > 1 ? absl::StrCat(w.writers, " ranks x ") : "";
  if (steps > 0) {
    w.share_of_tbw = drive_per_run / tbw;
    if (drive_per_run > allowed) {
      w.warning = absl::StrFormat(
          "WARNING drive wear: the run writes %.1f TB to NVMe (%s%d steps x %.2f GB), %.1f%% of "
          "the drive's rated %.0f TBW, more than the %.1f%% warn share",
          drive_per_run / 1e12, ranks, steps, written_per_step / 1e9, 100 * w.share_of_tbw,
          tbw / 1e12, 100 * limit.warn_share);
    }
  } else if (w.written_per_day > 0) {
    w.share_of_tbw = w.written_per_day / tbw;
    if (w.written_per_day > allowed) {
      w.warning = absl::StrFormat(
          "WARNING drive wear: a day of continuous training writes %.1f TB to NVMe%s, %.1f%% of "
          "the drive's rated %.0f TBW, more than the %.1f%% warn share",
          w.written_per_day / 1e12,
          w.writers > 1 ? absl::StrCat(" (", w.writers, " ranks)") : std::string(),
          100 * w.share_of_tbw, tbw / 1e12, 100 * limit.warn_share);
    }
  }
  return w;
}

std::string DriveWearText(const DriveWearLimit& limit, const DriveWear& w) {
  if (w.written_per_step == 0) return "";
  std::string out;
  if (w.written_per_day > 0) {
    absl::StrAppend(&out, absl::StrFormat("NVMe written per day %.2f TB (continuous training at "
                                          "the predicted step time%s)\n",
                                          w.written_per_day / 1e12,
                                          w.writers > 1 ? absl::StrCat("; the ", w.writers,
                                                                       " ranks sharing the drive")
                                                        : std::string()));
  }
  if (w.steps > 0) {
    absl::StrAppend(&out, absl::StrFormat("NVMe written per run %.2f TB (%d steps%s)\n",
                                          w.written_per_run / 1e12, w.steps,
                                          w.writers > 1 ? ", per rank" : ""));
  }
  if (limit.enabled()) {
    absl::StrAppend(
        &out, absl::StrFormat("drive wear: %.2f%% of the rated %.0f TBW per %s (warn above %.1f%%)",
                              100 * w.share_of_tbw, limit.rated_tbw_bytes / 1e12,
                              w.steps > 0 ? "run" : "day", 100 * limit.warn_share));
    if (w.days_to_warn_share > 0) {
      absl::StrAppend(&out, absl::StrFormat("; %.1f days of continuous training reach it",
                                            w.days_to_warn_share));
    }
    absl::StrAppend(&out, "\n");
  }
  if (!w.warning.empty()) absl::StrAppend(&out, w.warning, "\n");
  return out;
}

}  // namespace megatrain::engine::planner
