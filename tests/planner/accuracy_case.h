// One planner-accuracy case: a small model and job run for real on the CPU device (median step
// wall time, arena peak, VmHWM growth) next to what the planner predicts for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/planner.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine::planner {

struct AccuracyCase {
  std::string name;
  testing::TinyShape shape;
  PlanInputs inputs;  // budgets for NVMe cases are filled by RunCase/PredictCase
  double link_gbps = 0;
  bool nvme = false;
};

struct Measured {
  double step_seconds = 0;    // median wall time of Trainer::Step over the measured steps
  uint64_t arena_peak = 0;    // StepReport::device_arena_peak_bytes
  uint64_t vmhwm_growth = 0;  // VmHWM after the steps minus VmRSS before creating the trainer
};

// The cases of docs/planning.md: index 0 is the calibration case.
std::vector<AccuracyCase> StandardCases();

// Runs warmup + steps optimizer steps. nvme_dir: an O_DIRECT directory for NVMe cases.
absl::StatusOr<Measured> RunCase(const AccuracyCase& c, int warmup, int steps,
                                 const std::string& nvme_dir);

absl::StatusOr<PlanResult> PredictCase(const AccuracyCase& c, const HardwareProfile& local,
                                       const std::string& nvme_dir);

// The local probe with this case's link.
HardwareProfile WithLink(HardwareProfile local, double link_gbps);

}  // namespace megatrain::engine::planner
