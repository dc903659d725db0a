// Learning-rate schedule implementation.
#include "engine/train/lr_schedule.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::Status ValidateLrSchedule(const LrScheduleOptions& o) {
  if (!std::isfinite(o.peak_lr) || o.peak_lr <= 0 || o.peak_lr > 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr.peak_lr=", o.peak_lr, " must be in (0, 10]"));
  }
  if (!std::isfinite(o.min_lr_ratio) || o.min_lr_ratio < 0 || o.min_lr_ratio > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr.min_lr_ratio=", o.min_lr_ratio, " must be in [0, 1]"));
  }
  if (o.total_steps == 0) return absl::InvalidArgumentError("lr.total_steps=0 must be positive");
  return absl::OkStatus();
}

double LearningRateAt(const LrScheduleOptions& o, uint64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) {
    return o.peak_lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  }
  if (!o.cosine) return o.peak_lr;
  const double floor = o.peak_lr * o.min_lr_ratio;
  if (step >= o.total_steps || o.total_steps <= o.warmup_steps) return floor;
  const double progress = static_cast<double>(step - o.warmup_steps) /
                          static_cast<double>(o.total_steps - o.warmup_steps);
  const double pi = 3.14159265358979323846;
  return floor + (o.peak_lr - floor) * 0.5 * (1.0 + std::cos(pi * progress));
}

}  // namespace megatrain::engine
