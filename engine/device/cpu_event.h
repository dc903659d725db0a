// CpuEvent: an Event of the CPU device (generation counter + condition variable).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "engine/device/cpu_device_state.h"
#include "engine/device/device.h"

namespace megatrain::engine {

// Each RecordEvent takes the next generation when enqueued and completes it when the recording
// stream reaches it; a wait captures the generation current at enqueue time. Shared by pointer
// with the operations that reference it, so the Event object may be destroyed while they pend.
class CpuEventState {
 public:
  uint64_t BeginRecord();
  uint64_t latest_recorded() const;
  void Complete(uint64_t generation);
  void WaitFor(uint64_t generation) const;
  bool Completed(uint64_t generation) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable completed_cv_;
  uint64_t recorded_ = 0;
  uint64_t completed_ = 0;
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(std::shared_ptr<CpuDeviceState> device);
  absl::Status Synchronize() override;
  bool Query() override;
  const std::shared_ptr<CpuEventState>& state() const { return state_; }

 private:
  std::shared_ptr<CpuDeviceState> device_;
  std::shared_ptr<CpuEventState> state_;
};

}  // namespace megatrain::engine
