// The fallback GEMM kernel: one thread per output over FallbackGemmElement.
// Slow (no tiling, no tensor cores) but correct for every shape and
// alignment; used only where cuBLASLt has no algorithm.
#include "kernels/cuda/gemm_fallback.h"

namespace megatrain::kernels::cuda {
namespace {

__global__ void FallbackGemmKernel(FallbackGemmParams p) {
  const int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= p.n) return;
  for (int64_t i = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; i < p.m;
       i += int64_t{gridDim.y} * blockDim.y) {
    FallbackGemmElement(p, i, j);
  }
}

}  // namespace

namespace launch {

cudaError_t FallbackGemm(const FallbackGemmParams& params, cudaStream_t stream) {
  if (params.m == 0 || params.n == 0) return cudaSuccess;
  const FallbackGemmGrid grid = FallbackGemmGridFor(params.m, params.n);
  const dim3 blocks(static_cast<unsigned>(grid.blocks_x), static_cast<unsigned>(grid.blocks_y));
  const dim3 threads(kFallbackGemmTile, kFallbackGemmTile);
  FallbackGemmKernel<<<blocks, threads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
