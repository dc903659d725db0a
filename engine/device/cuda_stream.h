// CudaStream and CudaEvent: Stream and Event over cudaStream_t (non-blocking) and cudaEvent_t.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/device/cuda_device_state.h"
#include "engine/device/cuda_timing_events.h"
#include "engine/device/device_span_recorder.h"
#include "engine/device/device.h"

namespace megatrain::engine {

class CudaEvent final : public Event {
 public:
  // A sync-only event (cudaEventDisableTiming).
  static absl::StatusOr<std::unique_ptr<CudaEvent>> Create(std::shared_ptr<CudaDeviceState> device);
  ~CudaEvent() override;

  absl::Status Synchronize() override;
  bool Query() override;
  cudaEvent_t native_handle() const { return event_; }

 private:
  CudaEvent(std::shared_ptr<CudaDeviceState> device, cudaEvent_t event);
  const std::shared_ptr<CudaDeviceState> device_;
  const cudaEvent_t event_;
};

// Errors reported by host tasks, shared with their callbacks.
struct CudaStreamErrors {
  std::mutex mu;
  absl::Status error;
  bool failed() {
    std::lock_guard<std::mutex> lock(mu);
    return !error.ok();
  }
  void Set(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.ok()) error = std::move(status);
  }
};

class CudaHostTaskLane;

// Timeline: copies, waits and EnqueueTimed work get spans from timing-event pairs
// (DeviceSpanRecorder: resolved to host time once they complete, at the latest at Synchronize);
// host tasks time themselves on the host clock. Difference from the CPU device: a host task
// failing does not cancel copies already enqueued behind it (CUDA cannot), only what is enqueued
// after the failure is known.
class CudaStream final : public Stream {
 public:
  // host_task_thread: host tasks on a HostTaskLane (when the driver has stream memory
  // operations), else on the driver's callback thread.
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(
      std::string name, std::shared_ptr<CudaDeviceState> device, bool host_task_thread = true);
  ~CudaStream() override;  // synchronizes, then stops its lane and destroys the cudaStream_t

  std::string_view name() const override { return name_; }
  void CopyHostToDevice(void* dst_device, const void* src_host, size_t bytes,
                        TimelineTag tag) override;
  void CopyDeviceToHost(void* dst_host, const void* src_device, size_t bytes,
                        TimelineTag tag) override;
  void CopyDeviceToDevice(void* dst_device, const void* src_device, size_t bytes,
                          TimelineTag tag) override;
  void EnqueueHostTask(std::function<void()> fn, TimelineTag tag) override;
  void EnqueueFallibleHostTask(std::function<absl::Status()> fn, TimelineTag tag) override;
  void RecordEvent(Event& event) override;
  void WaitEvent(const Event& event, TimelineTag tag) override;
  absl::Status Synchronize() override;
  absl::Status Failure() override;

  // Runs `enqueue` (which launches kernels or cuBLAS calls on the stream it is
  // given, native_handle()) between the two events of one timeline span with
  // `tag` (kind tag.kind); returns what `enqueue` returns.
  absl::Status EnqueueTimed(const TimelineTag& tag,
                            absl::FunctionRef<absl::Status(cudaStream_t)> enqueue);
  const DeviceSpanRecorder& spans() const { return *spans_; }

  // For launching our kernels and cuBLAS/cuDNN calls on this stream.
  cudaStream_t native_handle() const { return stream_; }
  // Whether host tasks run on the stream's own thread (else on the driver's callback thread),
  // and if not, why (the driver lacks stream memory operations, the probe failed, or it is off).
  bool has_host_task_lane() const { return lane_ != nullptr; }
  const absl::Status& host_task_lane_status() const { return lane_status_; }

 private:
  CudaStream(std::string name, std::shared_ptr<CudaDeviceState> device, cudaStream_t stream);
  bool Skipping();
  void Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, std::string_view what,
            const TimelineTag& tag);
  void Fail(absl::Status status);

  const std::string name_;
  const std::shared_ptr<CudaDeviceState> device_;
  const cudaStream_t stream_;
  const std::shared_ptr<CudaStreamErrors> errors_;
  // The host-task lane and its word (pinned, mapped: the device polls it); null without one.
  std::unique_ptr<CudaHostTaskLane> lane_;
  absl::Status lane_status_;
  // Timing events before the recorder that holds their ids (destroyed after it).
  std::unique_ptr<CudaTimingEvents> timing_;
  std::unique_ptr<DeviceSpanRecorder> spans_;
};

}  // namespace megatrain::engine
