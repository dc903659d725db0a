// RankObserver: what a rank of a job on several machines (megatrain_rank) does with its run's
// events: rank 0 writes them to stdout for the daemon (server/rank_protocol.h); every rank
// answers the daemon's requests, which arrive as signals mpirun forwards.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "engine/train/training_run.h"

namespace megatrain::server {

// The daemon's requests as the rank's signal handlers record them.
struct RankRequests {
  std::atomic<bool> pause{false};       // SIGUSR1: stop after a checkpoint
  std::atomic<bool> checkpoint{false};  // SIGUSR2: checkpoint now
};

// Writes `line` whole to stdout (one write where it fits; mpirun forwards writes), retrying
// interrupted writes.
void EmitLine(const std::string& line);

class RankObserver final : public engine::TrainingObserver {
 public:
  // `speaks`: rank 0. `ranks`: the job's, to report a step's tokens as the whole job's.
  // `hold_after_step`: the daemon's test hook (--test_hold_after_step), 0 = off.
  RankObserver(RankRequests& requests, bool speaks, int ranks, uint64_t hold_after_step)
      : requests_(requests), speaks_(speaks), ranks_(ranks), hold_after_step_(hold_after_step) {}

  void OnLine(const std::string& line, bool keep) override;
  void OnStep(const engine::StepReport& report, double validation_loss) override;
  bool ShouldStop() override;
  bool CheckpointBeforeStop() override { return true; }  // a cancel ends the rank instead
  bool ShouldCheckpoint() override { return requests_.checkpoint.exchange(false); }
  void OnCheckpoint(uint64_t step, const std::string& path) override;

  // The run's result as the whole job's (rank 0 only): tokens/s times the ranks.
  void OnResult(engine::TrainingRunResult result);
  void OnStopped(const std::string& why);

 private:
  RankRequests& requests_;
  const bool speaks_;
  const int ranks_;
  const uint64_t hold_after_step_;
  uint64_t first_step_ = 0;  // of this run (after a resume, the checkpoint's step + 1)
  uint64_t last_step_ = 0;
};

}  // namespace megatrain::server
