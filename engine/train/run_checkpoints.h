// The checkpoints of one training run: what identifies the run in them (its job JSON, data
// checksums and provenance), resuming from the newest one, and writing them beside the steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/async_checkpoint_writer.h"
#include "engine/checkpoint/manifest.h"
#include "engine/dist/communicator.h"
#include "engine/model/safetensors_dtype.h"
#include "engine/provenance/record.h"
#include "engine/train/training_run.h"
#include "engine/train/trainer.h"

namespace megatrain::engine {

// The dtype a run's checkpoints write the model in: options.checkpoint_dtype (F32, BF16 or
// F16), else the Hugging Face source's 16-bit dtype, else F32.
absl::StatusOr<SafetensorsDtype> RunCheckpointDtype(const TrainingRunOptions& options);

// Where a resumed run continues.
struct ResumePoint {
  std::string path;           // the checkpoint loaded
  uint64_t step = 0;          // the last step it holds
  uint64_t data_cursor = 0;   // TokenWindows::cursor() after that step
};

class RunCheckpoints {
 public:
  // Checksums the data files and makes the provenance context (the given lineage, or one hashed
  // now); without options.checkpoint_dir the run writes none and this does nothing.
  static absl::StatusOr<std::unique_ptr<RunCheckpoints>> Create(const TrainingRunOptions& options,
                                                                SafetensorsDtype model_dtype);
  RunCheckpoints(const RunCheckpoints&) = delete;
  RunCheckpoints& operator=(const RunCheckpoints&) = delete;

  bool enabled() const { return !options_.checkpoint_dir.empty(); }

  // With options.resume and a checkpoint in the directory: verifies it (the same job and data,
  // unless allow_changed_data_files), loads it into `trainer` and says where to continue.
  absl::StatusOr<std::optional<ResumePoint>> Resume(Trainer& trainer);

  // Waits for the previous write, then starts writing the trainer's current step.
  absl::Status Start(Trainer& trainer, uint64_t data_cursor, TrainingObserver& observer);
  // Waits for the write in flight and reports it to `observer` when it committed one.
  absl::Status Collect(TrainingObserver& observer);
  bool Idle() const { return writer_.Idle(); }
  // ZeRO-1 (docs/scale_out.md): every rank of `comm` writes the trainer's current step together,
  // synchronously (WriteShardedCheckpoint, a collective: every rank calls it at the same step),
  // then reports it to `observer`. A failure on any rank fails it on every rank.
  absl::Status WriteSharded(Trainer& trainer, uint64_t data_cursor, dist::Communicator& comm,
                            TrainingObserver& observer);
  const std::string& last_checkpoint() const { return last_checkpoint_; }

 private:
  RunCheckpoints(const TrainingRunOptions& options, SafetensorsDtype model_dtype)
      : options_(options), model_dtype_(model_dtype), job_json_(TrainingJobJson(options)) {}
  CheckpointRunInfo RunInfo(uint64_t data_cursor) const;
  CheckpointOptions WriteOptions() const;

  const TrainingRunOptions& options_;
  SafetensorsDtype model_dtype_;
  std::string job_json_;
  std::vector<DataFileRecord> data_files_;
  std::shared_ptr<const provenance::ProvenanceContext> provenance_;
  // The HF source's tokenizer and generation files, read once; copied into every checkpoint.
  std::shared_ptr<const std::vector<HfCompanionFile>> hf_companion_files_;
  uint64_t pending_step_ = 0;
  std::string last_checkpoint_;
  // Last, so it is destroyed first: its destructor waits for the write in flight, which reads
  // the members above. Destroy the RunCheckpoints before the trainer.
  AsyncCheckpointWriter writer_;
};

}  // namespace megatrain::engine
