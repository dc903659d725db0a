// Launcher of the fallback GEMM kernel (gemm_fallback.cu): what CublasLtGemm
// runs when cuBLASLt offers no algorithm for a shape. Trusts its arguments
// (CublasLtGemm::Matmul validated them); returns cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm_fallback_body.h"

namespace megatrain::kernels::cuda::launch {

cudaError_t FallbackGemm(const FallbackGemmParams& params, cudaStream_t stream);

}  // namespace megatrain::kernels::cuda::launch
