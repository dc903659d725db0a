// TrainingState (trainer_state.json): everything beyond the tensors that a
// resumed run needs to continue bitwise: the optimizer position, the data
// cursor, the seed the data order derives from, and the job spec.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/checkpoint/trainer_progress.h"

namespace megatrain::engine {

inline constexpr int kTrainingStateVersion = 1;
inline constexpr char kTrainingStateFileName[] = "trainer_state.json";

struct TrainingState {
  TrainerProgress progress;  // step = the LR schedule's position
  // Training windows consumed so far (TokenWindows::cursor()).
  uint64_t data_cursor = 0;
  // The run's seed. There is no other random state: the data order of epoch e
  // is a pure function of (seed, e) and the model has no dropout.
  uint64_t seed = 0;
  // The job's own description (a JSON object as text), kept so a user can tell
  // how the checkpoint was produced and a resume can refuse a changed job.
  std::string job_json = "{}";
};

std::string TrainingStateToJson(const TrainingState& state);
// Strict: version must be kTrainingStateVersion, no unknown or missing keys.
absl::StatusOr<TrainingState> ParseTrainingState(std::string_view text, const std::string& source);

}  // namespace megatrain::engine
