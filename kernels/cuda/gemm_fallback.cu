// The fallback GEMM kernels: a thread per output over FallbackGemmElement
// (short k), a warp per output over FallbackGemmLanePartial (long k). Slow (no
// tiling, no tensor cores) but correct for every shape and alignment; used
// only where cuBLASLt has no algorithm.
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

// One warp per output; lanes split k, then a fixed shuffle tree (the loop
// bound is the same for every lane of a warp, so the full-warp shuffle is safe).
__global__ void FallbackGemmWarpKernel(FallbackGemmParams p) {
  const int lane = static_cast<int>(threadIdx.x % kWarpLanes);
  const int64_t outputs = p.m * p.n;
  const int64_t stride = int64_t{gridDim.x} * kFallbackWarpsPerBlock;
  for (int64_t w = int64_t{blockIdx.x} * kFallbackWarpsPerBlock + threadIdx.x / kWarpLanes;
       w < outputs; w += stride) {
    const int64_t i = w / p.n;
    const int64_t j = w % p.n;
    float sum = FallbackGemmLanePartial(p, i, j, lane);
    for (int offset = kWarpLanes / 2; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) FallbackGemmStore(p, i, j, sum);
  }
}

}  // namespace

namespace launch {

cudaError_t FallbackGemm(const FallbackGemmParams& params, cudaStream_t stream) {
  if (params.m == 0 || params.n == 0) return cudaSuccess;
  if (FallbackGemmUsesWarps(params.k)) {
    const auto blocks = static_cast<unsigned>(FallbackGemmWarpBlocks(params.m, params.n));
    FallbackGemmWarpKernel<<<blocks, kFallbackWarpsPerBlock * kWarpLanes, 0, stream>>>(params);
    return cudaGetLastError();
  }
  const FallbackGemmGrid grid = FallbackGemmGridFor(params.m, params.n);
  const dim3 blocks(static_cast<unsigned>(grid.blocks_x), static_cast<unsigned>(grid.blocks_y));
  const dim3 threads(kFallbackGemmTile, kFallbackGemmTile);
  FallbackGemmKernel<<<blocks, threads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
