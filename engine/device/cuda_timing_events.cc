// CudaTimingEvents: timing events (cudaEventDefault, not DisableTiming)
// recorded on the stream; every runtime result checked through the device
// state, so a sticky error marks the device faulted.
#include "engine/device/cuda_timing_events.h"

#include <utility>

namespace megatrain::engine {
namespace {

// Checks through the device (a sticky error faults it) and clears the
// runtime's per-thread last error, so a failed timing call is never reported
// by the next kernel launch's cudaGetLastError.
absl::Status Checked(CudaDeviceState& device, cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return device.Check(error, what);
}

}  // namespace

CudaTimingEvents::CudaTimingEvents(std::shared_ptr<CudaDeviceState> device, cudaStream_t stream)
    : device_(std::move(device)), stream_(stream) {}

CudaTimingEvents::~CudaTimingEvents() {
  for (cudaEvent_t event : events_)
    (void)Checked(*device_, cudaEventDestroy(event), "cudaEventDestroy");
}

absl::StatusOr<int> CudaTimingEvents::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_.empty()) {
    const int id = free_.back();
    free_.pop_back();
    return id;
  }
  // Events belong to the device current on the creating thread: make it this stream's.
  if (absl::Status s = device_->MakeCurrent(); !s.ok()) return s;
  cudaEvent_t event = nullptr;
  if (absl::Status s =
          Checked(*device_, cudaEventCreateWithFlags(&event, cudaEventDefault), "cudaEventCreate");
      !s.ok()) {
    return s;
  }
  events_.push_back(event);
  return static_cast<int>(events_.size()) - 1;
}

void CudaTimingEvents::Release(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(id);
}

absl::Status CudaTimingEvents::Record(int id) {
  cudaEvent_t event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    event = events_[id];
  }
  return Checked(*device_, cudaEventRecord(event, stream_), "cudaEventRecord(timing)");
}

TimingEvents::State CudaTimingEvents::Query(int id) {
  cudaEvent_t event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    event = events_[id];
  }
  const cudaError_t result = cudaEventQuery(event);
  if (result == cudaSuccess) return State::kDone;
  if (result == cudaErrorNotReady) return State::kPending;
  (void)Checked(*device_, result, "cudaEventQuery(timing)");
  return State::kFailed;
}

absl::StatusOr<double> CudaTimingEvents::ElapsedMs(int from, int to) {
  cudaEvent_t start, end;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start = events_[from];
    end = events_[to];
  }
  float ms = 0.0f;
  if (absl::Status s =
          Checked(*device_, cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
      !s.ok()) {
    return s;
  }
  return static_cast<double>(ms);
}

absl::Status CudaTimingEvents::WaitFor(int id) {
  cudaEvent_t event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    event = events_[id];
  }
  return Checked(*device_, cudaEventSynchronize(event), "cudaEventSynchronize(timing anchor)");
}

}  // namespace megatrain::engine
