// JobRunner::StepObserver: what the runner learns from a running job (lines, steps, checkpoints)
// and what the job learns from it (stop, checkpoint-now), between the engine's steps. Private to
// the runner (job_runner.cc and job_step_observer.cc); it reads and writes the runner's state
// under its mutex.
#pragma once

#include <cstdint>
#include <string>

#include "engine/train/training_run.h"
#include "server/job_runner.h"

namespace megatrain::server {

// Reports the running job's steps to the runner; polled for stop requests between steps.
class JobRunner::StepObserver final : public engine::TrainingObserver {
 public:
  StepObserver(JobRunner& runner, std::string id) : runner_(runner), id_(std::move(id)) {}

  void OnLine(const std::string& line, bool keep) override;
  void OnStep(const engine::StepReport& report, double validation_loss) override;
  bool ShouldStop() override;
  bool CheckpointBeforeStop() override;
  bool ShouldCheckpoint() override;
  void OnCheckpoint(uint64_t step, const std::string& path) override;
  // Each reply becomes an event of its own (stored, held for watchers, logged) and the
  // history's latest round.
  void OnEvalReplies(uint64_t step, std::vector<engine::EvalReplyReport>& replies) override;

 private:
  // Adaptive recomputation: a job event with each block's mode and reason whenever the modes
  // change (the first step included).
  void LogActivationModesIfChanged(const engine::StepReport& report);
  static v1::TierUsage MakeTier(const char* tier, uint64_t bytes);

  JobRunner& runner_;
  const std::string id_;
  bool first_step_seen_ = false;
  bool held_logged_ = false;
  std::string activation_modes_;  // the last logged per-block activation modes
  uint64_t first_step_ = 1;       // of this run (after a resume, the checkpoint's step + 1)
};

}  // namespace megatrain::server
