// DeviceOptions: the knobs of a device (CPU emulation or CUDA), validated once at creation.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::engine {

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda".
std::string_view DeviceKindName(DeviceKind kind);
// Accepts "cpu" and "cuda"; anything else is INVALID_ARGUMENT naming the value.
absl::StatusOr<DeviceKind> ParseDeviceKind(std::string_view name);

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kCpu;
  // Capacity of the device memory arena in bytes; every DeviceBuffer comes from it and nothing
  // falls back beyond it. Must be > 0.
  size_t arena_bytes = 0;
  // Pinned host memory allowed in bytes; 0 = none (every non-empty AllocatePinned fails).
  size_t pinned_budget_bytes = 0;
  // Start with timeline recording on (toggle later with Device::timeline().set_enabled()).
  bool record_timeline = false;
  // CPU device only: emulated bandwidth of each link direction in GB/s (1e9 bytes/s);
  // 0 = unthrottled (copies run at memcpy speed).
  double link_gbps = 0;
  // CPU device only: emulated latency added to every host<->device copy, in microseconds;
  // 0 = none.
  double link_latency_us = 0;
  // CUDA only: the device ordinal to use.
  int cuda_device_ordinal = 0;
  // CUDA only: run each stream's host tasks on a thread of its own, the stream waiting on a
  // word the thread writes (cuStreamWaitValue32), instead of on the driver's one callback thread
  // that all streams share (host_task_lane.h). Falls back to the callback thread where the
  // driver lacks stream memory operations; false forces that (a first-run diagnosis switch).
  bool cuda_host_task_threads = true;
  // CUDA only: host threads waiting for the GPU (stream and event synchronization) sleep
  // (cudaDeviceScheduleBlockingSync) instead of spinning a core that the host optimizer, which
  // uses every core by default, could use. Best effort: where the device's flags cannot be set
  // (its primary context already runs with others), CudaDevice::blocking_sync_status() says
  // why and the driver's default stays. false = the driver's default (spin while cores are spare).
  bool cuda_blocking_sync = true;
};

// INVALID_ARGUMENT naming the field and value for: arena_bytes == 0, link_gbps or
// link_latency_us negative or not finite, negative cuda_device_ordinal.
absl::Status ValidateDeviceOptions(const DeviceOptions& options);

}  // namespace megatrain::engine
