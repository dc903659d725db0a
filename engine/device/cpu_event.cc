// CpuEvent: generation bookkeeping.
#include "engine/device/cpu_event.h"

#include <algorithm>
#include <utility>

namespace megatrain::engine {

uint64_t CpuEventState::BeginRecord() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++recorded_;
}

uint64_t CpuEventState::latest_recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

void CpuEventState::Complete(uint64_t generation) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed_ = std::max(completed_, generation);
  }
  completed_cv_.notify_all();
}

void CpuEventState::WaitFor(uint64_t generation) const {
  std::unique_lock<std::mutex> lock(mu_);
  completed_cv_.wait(lock, [&] { return completed_ >= generation; });
}

bool CpuEventState::Completed(uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= generation;
}

CpuEvent::CpuEvent(std::shared_ptr<CpuDeviceState> device)
    : device_(std::move(device)), state_(std::make_shared<CpuEventState>()) {}

absl::Status CpuEvent::Synchronize() {
  state_->WaitFor(state_->latest_recorded());
  return device_->fault();
}

bool CpuEvent::Query() { return state_->Completed(state_->latest_recorded()); }

}  // namespace megatrain::engine
