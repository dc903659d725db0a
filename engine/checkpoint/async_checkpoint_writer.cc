// AsyncCheckpointWriter implementation.
#include "engine/checkpoint/async_checkpoint_writer.h"

namespace megatrain::engine {

AsyncCheckpointWriter::~AsyncCheckpointWriter() { Wait().IgnoreError(); }

absl::StatusOr<std::optional<std::string>> AsyncCheckpointWriter::Wait() {
  if (thread_.joinable()) thread_.join();
  if (!result_.has_value()) return std::optional<std::string>();
  absl::StatusOr<std::string> result = std::move(*result_);
  result_.reset();
  if (!result.ok()) return result.status();
  return std::optional<std::string>(std::move(*result));
}

absl::Status AsyncCheckpointWriter::Start(Checkpointable& trainer, const std::string& root,
                                          const CheckpointRunInfo& run,
                                          const CheckpointOptions& options) {
  if (absl::StatusOr<std::optional<std::string>> previous = Wait(); !previous.ok()) {
    return previous.status();
  }
  if (absl::Status s = CheckUpdatesSucceeded(trainer); !s.ok()) return s;
  if (trainer.store().state_store() != nullptr) {
    absl::StatusOr<std::string> path = WriteCheckpoint(trainer, root, run, options);
    result_ = std::move(path);
    return absl::OkStatus();
  }
  trainer.BeginSnapshot();
  const TrainerProgress progress = trainer.progress();
  finished_ = false;
  thread_ = std::thread([this, &trainer, progress, root, run, options] {
    absl::StatusOr<std::string> path =
        WriteCheckpointSnapshot(trainer, progress, root, run, options,
                                [&trainer](int entry) { trainer.SnapshotEntryDone(entry); });
    trainer.EndSnapshot();
    result_ = std::move(path);
    finished_ = true;
  });
  return absl::OkStatus();
}

}  // namespace megatrain::engine
