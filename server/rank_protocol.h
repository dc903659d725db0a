// The rank protocol: what megatrain_rank (a rank of a job with JobSpec.hosts) tells the daemon
// that launched it, one JSON object per stdout line (rank 0's progress, any rank's error), and
// RankEvents, the daemon's side that turns those lines back into observer calls and an outcome.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/train/step_report.h"
#include "engine/train/training_run.h"

namespace megatrain::server {

// Each is one line, '\n' included, for a single write() (mpirun forwards whole writes).
std::string RankLineEvent(const std::string& line, bool keep);
std::string RankStepEvent(const engine::StepReport& report, double validation_loss);
std::string RankCheckpointEvent(uint64_t step, const std::string& path);
std::string RankResultEvent(const engine::TrainingRunResult& result);
std::string RankStoppedEvent(const std::string& why);
std::string RankErrorEvent(int rank, const std::string& host, const absl::Status& error);

// Reads the launcher's stdout line by line: events reach `observer` as in a run in the daemon's
// process; any other line (the launcher's own words) becomes a kept line; a line that claims to
// be an event but does not parse is reported as a line, never trusted.
class RankEvents {
 public:
  explicit RankEvents(engine::TrainingObserver& observer) : observer_(observer) {}
  void OnOutputLine(const std::string& line);

  // Rank 0's result (the run finished), its stop (a requested stop ended it) and the first error
  // any rank reported, naming the rank and its host.
  const std::optional<engine::TrainingRunResult>& result() const { return result_; }
  const std::optional<std::string>& stopped() const { return stopped_; }
  const std::optional<absl::Status>& first_error() const { return first_error_; }
  // Rank 0 has spoken: every rank is past MPI's start (and has its signal handlers).
  bool started() const { return started_; }

 private:
  engine::TrainingObserver& observer_;
  bool started_ = false;
  std::optional<engine::TrainingRunResult> result_;
  std::optional<std::string> stopped_;
  std::optional<absl::Status> first_error_;
};

}  // namespace megatrain::server
