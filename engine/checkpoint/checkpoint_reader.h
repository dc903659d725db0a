// LoadCheckpoint: verifies a checkpoint directory completely, then restores a
// trainer's fp32 masters, AdamW m and v and optimizer position from it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpointable.h"
#include "engine/checkpoint/manifest.h"
#include "engine/checkpoint/training_state.h"

namespace megatrain::engine {

struct LoadedCheckpoint {
  CheckpointManifest manifest;
  TrainingState state;  // progress already restored into the trainer
};

// All-or-nothing: every file's size and CRC32C is checked against the
// manifest, the config must equal the trainer's model, and every tensor of
// the layout must be present with its shape and dtype in the model and
// optimizer files before the first parameter is written. Errors name the
// file and what is wrong; on error the trainer is untouched. The optimizer state may be one file
// or ZeRO-1 shards, a tensor whole or in pieces (OptimizerPieceName) that must cover it exactly
// once. A store holding only a range of an entry's optimizer state (a ZeRO-1 rank,
// ParameterStore::optimizer_state_range) reads and restores m and v of that range only, and every
// master: a checkpoint of any world size resumes on any other.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir, Checkpointable& trainer);

}  // namespace megatrain::engine
