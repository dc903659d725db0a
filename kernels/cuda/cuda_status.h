// Maps CUDA runtime and cuBLAS status codes onto absl::Status with the
// library's own error name and string, plus the caller's context.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace megatrain::kernels::cuda {

// OK for cudaSuccess. Out of memory -> RESOURCE_EXHAUSTED; no device / driver
// too old -> UNAVAILABLE; invalid arguments or launch configuration ->
// INVALID_ARGUMENT; everything else (including sticky faults such as an
// illegal address, which leave the context unusable) -> INTERNAL.
absl::Status CudaStatus(cudaError_t error, absl::string_view context);

// OK for CUBLAS_STATUS_SUCCESS; otherwise a code chosen like CudaStatus.
absl::Status CublasStatus(cublasStatus_t status, absl::string_view context);

}  // namespace megatrain::kernels::cuda
