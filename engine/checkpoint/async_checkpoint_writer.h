// AsyncCheckpointWriter: writes a checkpoint on a background thread while
// training continues (Trainer's snapshot protocol: the next steps' forward
// and backward run alongside; their optimizer updates of an entry wait until
// the writer has that entry on disk). One write in flight at a time.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/checkpoint/checkpointable.h"

namespace megatrain::engine {

class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter() = default;
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;
  // Waits for the write in flight. Destroy (or Wait) before the trainer.
  ~AsyncCheckpointWriter();

  // Waits for the previous write (returning its error, if it failed), then
  // starts writing the trainer's current step. When the optimizer state lives
  // on the NVMe tier (whose store serves one thread), writes synchronously.
  absl::Status Start(Checkpointable& trainer, const std::string& root, const CheckpointRunInfo& run,
                     const CheckpointOptions& options = {});

  // Waits for the write in flight; the path of the newest checkpoint written
  // (nullopt if none was started since the last Wait), or the write's error.
  absl::StatusOr<std::optional<std::string>> Wait();
  // True when no write is in flight (Wait would not block).
  bool Idle() const { return !thread_.joinable() || finished_.load(); }

 private:
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::optional<absl::StatusOr<std::string>> result_;  // written by thread_, read after join
};

}  // namespace megatrain::engine
