// JobEngine: what the runner thread calls to execute one validated job; an interface so tests
// can run the daemon with a fake (blocking, failing, device-faulting) engine.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/train/text_training.h"
#include "server/job_spec_validation.h"

namespace megatrain::server {

class JobEngine {
 public:
  virtual ~JobEngine() = default;
  // Runs `job` to its end on the runner thread, reporting through `observer`; returns CANCELLED
  // when observer.ShouldStop() stopped it, the engine's error otherwise.
  virtual absl::Status Run(const std::string& job_id, const ValidatedJob& job,
                           engine::TrainingObserver& observer) = 0;
};

// A device fault (CUDA sticky error, injected CPU fault): the device is unusable until restart.
bool IsDeviceFault(const absl::Status& status);

// The real engine: engine::TrainOnText on a device created from the job's DeviceOptions; writes
// <output_dir>/result.json when the job names an output directory.
class TextJobEngine final : public JobEngine {
 public:
  absl::Status Run(const std::string& job_id, const ValidatedJob& job,
                   engine::TrainingObserver& observer) override;
};

}  // namespace megatrain::server
