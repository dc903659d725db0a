// Learning-rate schedule: linear warmup from 0, then constant or cosine decay
// to a floor; a pure function of the step so resume needs only the step.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace megatrain::engine {

struct LrScheduleOptions {
  double peak_lr = 3e-4;
  uint64_t warmup_steps = 0;  // steps 1..warmup ramp linearly to peak_lr
  bool cosine = true;         // false = constant after warmup
  uint64_t total_steps = 1;   // cosine reaches the floor here
  double min_lr_ratio = 0.1;  // floor as a fraction of peak_lr
};

absl::Status ValidateLrSchedule(const LrScheduleOptions& options);

// Learning rate of optimizer step `step` (1-based).
double LearningRateAt(const LrScheduleOptions& options, uint64_t step);

}  // namespace megatrain::engine
