// CudaDeviceState: CUDA error classification and the sticky fault.
#include "engine/device/cuda_device_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

bool IsStickyCudaError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorTensorMemoryLeak:
      return true;
    default:
      return false;
  }
}

absl::Status CudaErrorToStatus(cudaError_t error, std::string_view what) {
  const std::string message = absl::StrCat(std::string(what), " failed: ", cudaGetErrorName(error),
                                           " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaSuccess:
      return absl::OkStatus();
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

CudaDeviceState::CudaDeviceState(int ordinal, std::string name)
    : ordinal_(ordinal), name_(std::move(name)) {}

absl::Status CudaDeviceState::Check(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  absl::Status status =
      CudaErrorToStatus(error, absl::StrCat("device '", name_, "': ", std::string(what)));
  if (IsStickyCudaError(error)) {
    std::lock_guard<std::mutex> lock(fault_mu_);
    if (fault_.ok()) fault_ = status;
  }
  return status;
}

absl::Status CudaDeviceState::MakeCurrent() {
  return Check(cudaSetDevice(ordinal_), "cudaSetDevice");
}

absl::Status CudaDeviceState::fault() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  return fault_;
}

}  // namespace megatrain::engine
