// Checkpointable: what the checkpoint writer and reader need of a trainer (its model, parameter
// store, optimizer position and snapshot protocol), so that checkpoints sit below engine/train.
#pragma once

#include "engine/checkpoint/trainer_progress.h"
#include "engine/exec/parameter_store.h"
#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"

namespace megatrain::engine {

// Implemented by engine::Trainer (engine/train/trainer.h documents each call).
class Checkpointable {
 public:
  virtual ~Checkpointable() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ParameterLayout& layout() const = 0;
  virtual const ParameterStore& store() const = 0;
  virtual ParameterStore& mutable_store() = 0;

  // Waits until the last optimizer update has finished writing the store.
  virtual void WaitForUpdates() = 0;
  // As WaitForUpdates; then the first failure of an optimizer update (or of the initial weights'
  // write) since the store was last whole, else OK. A store such a failure left partly updated
  // must not be checkpointed: its progress already counts the update.
  virtual absl::Status UpdateStatus() = 0;
  // After WaitForUpdates: the optimizer position; RestoreProgress is for resume, after the
  // store's buffers have been filled from a checkpoint.
  virtual TrainerProgress progress() const = 0;
  virtual void RestoreProgress(const TrainerProgress& progress) = 0;

  // Snapshot protocol: between BeginSnapshot and EndSnapshot no optimizer update touches entry
  // e (master, m, v) until SnapshotEntryDone(e), so a writer reads it while training goes on.
  virtual void BeginSnapshot() = 0;
  virtual void SnapshotEntryDone(int entry) = 0;
  virtual void EndSnapshot() = 0;
};

}  // namespace megatrain::engine
