// JobHistories: each job's step history for the dashboard (loss, validation loss, learning rate,
// gradient norm, tokens/s over time; the latest step's per-layer timings; NVMe totals; the latest
// replies to the eval prompts), fed by the runner's step observer. Memory is constant per job
// whatever the run's length: each series is a BoundedSeries of at most kHistorySamples samples.
// Kept in memory only (a restarted daemon starts each job's history afresh); thread-safe under its
// own mutex, never the runner's.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/train/step_report.h"
#include "proto/megatrain.pb.h"
#include "server/bounded_series.h"

namespace megatrain::server {

// Samples per series and job (a sample is a few dozen bytes).
inline constexpr size_t kHistorySamples = 512;

class JobHistories {
 public:
  explicit JobHistories(size_t samples = kHistorySamples) : samples_(samples) {}

  // One step of job `id` (validation_loss: the latest evaluation, NaN before the first).
  void Record(const std::string& id, const engine::StepReport& report, double validation_loss,
              int64_t unix_ms);
  // The latest evaluation's replies to the job's eval prompts (replacing the previous round's).
  void RecordEvalReplies(const std::string& id, const std::vector<v1::EvalReply>& replies);
  // The job's history; nullopt when no step or reply of it was recorded.
  std::optional<v1::JobHistory> Get(const std::string& id) const;
  void Remove(const std::string& id);

 private:
  struct History {
    explicit History(size_t samples) : steps(samples), validation(samples) {}
    BoundedSeries<v1::StepSample> steps;
    BoundedSeries<v1::ValidationSample> validation;
    v1::JobHistory latest;  // layers, their step, NVMe totals, eval replies (no series)
  };

  const size_t samples_;
  mutable std::mutex mu_;
  std::map<std::string, History> jobs_;  // guarded by mu_
};

}  // namespace megatrain::server
