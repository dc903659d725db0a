// CudaTimingEvents: the TimingEvents of one CUDA stream (a pool of timing
// cudaEvent_t, reused), for its DeviceSpanRecorder.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "engine/device/cuda_device_state.h"
#include "engine/device/device_span_recorder.h"

namespace megatrain::engine {

class CudaTimingEvents final : public TimingEvents {
 public:
  CudaTimingEvents(std::shared_ptr<CudaDeviceState> device, cudaStream_t stream);
  ~CudaTimingEvents() override;  // destroys every event (the stream must be drained)

  absl::StatusOr<int> Acquire() override;
  void Release(int id) override;
  absl::Status Record(int id) override;
  State Query(int id) override;
  absl::StatusOr<double> ElapsedMs(int from, int to) override;
  absl::Status WaitFor(int id) override;

 private:
  const std::shared_ptr<CudaDeviceState> device_;
  const cudaStream_t stream_;
  std::mutex mu_;
  std::vector<cudaEvent_t> events_;  // index = id
  std::vector<int> free_;
};

}  // namespace megatrain::engine
