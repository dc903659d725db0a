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

// Where a job's checkpoints live: <output_dir>/checkpoints, or <state_dir>/jobs/<id>/checkpoints
// for a job without an output directory.
std::string JobCheckpointDir(const std::string& state_dir, const std::string& job_id,
                             const ValidatedJob& job);

// The real engine: engine::TrainOnText on a device created from the job's DeviceOptions, with
// checkpoints per the job's CheckpointPolicy under JobCheckpointDir and resume on (a restarted or
// resumed job continues from its newest checkpoint); writes <output_dir>/result.json when the
// job names an output directory.
class TextJobEngine final : public JobEngine {
 public:
  explicit TextJobEngine(std::string state_dir) : state_dir_(std::move(state_dir)) {}
  absl::Status Run(const std::string& job_id, const ValidatedJob& job,
                   engine::TrainingObserver& observer) override;

 private:
  const std::string state_dir_;
};

}  // namespace megatrain::server
