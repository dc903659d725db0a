// CudaDeviceState: what a CudaDevice shares with its streams and events: the ordinal, the sticky
// device fault, the timeline, and the checking of every CUDA runtime result.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/device/timeline.h"

namespace megatrain::engine {

// Whether `error` poisons the CUDA context (illegal address, launch failure, ...): the device is
// unusable until the process restarts.
bool IsStickyCudaError(cudaError_t error);

// `what` failed with `error`, as a Status (RESOURCE_EXHAUSTED for out-of-memory, INVALID_ARGUMENT
// for invalid values, INTERNAL otherwise), naming the CUDA error.
absl::Status CudaErrorToStatus(cudaError_t error, std::string_view what);

class CudaDeviceState {
 public:
  CudaDeviceState(int ordinal, std::string name);

  int ordinal() const { return ordinal_; }
  const std::string& name() const { return name_; }
  Timeline& timeline() { return timeline_; }

  // OK for cudaSuccess; otherwise the error as a Status, and a sticky error also becomes the
  // device fault.
  absl::Status Check(cudaError_t error, std::string_view what);
  // Makes this device current on the calling thread (CUDA's current device is per thread).
  absl::Status MakeCurrent();

  absl::Status fault() const;

 private:
  const int ordinal_;
  const std::string name_;
  Timeline timeline_;
  mutable std::mutex fault_mu_;
  absl::Status fault_;
};

}  // namespace megatrain::engine
