// CUDA RMSNorm: forward (one block per row, saves rstd) and backward (dx one
// block per row; dw by fixed row groups -> partials -> in-order final sum).
#include "kernels/cuda/bf16_storage.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/rmsnorm_bodies.h"
#include "kernels/cuda/thread_bodies.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

// The row bodies live in rmsnorm_bodies.h (replayed on the CPU by
// block_bodies_test); the kernels only own the shared scratch.
__global__ void __launch_bounds__(kRowThreads)
    RmsnormForwardKernel(const bf16* x, const bf16* w, int dim, float eps, bf16* y, float* rstd) {
  __shared__ float scratch[kRowThreads / 32];
  RmsnormForwardRow<S, kRowThreads>(x, w, dim, eps, y, rstd, scratch);
}

__global__ void __launch_bounds__(kRowThreads)
    RmsnormBackwardInputKernel(const bf16* x, const bf16* w, const float* rstd, const bf16* dy,
                               int dim, bool accumulate, bf16* dx) {
  __shared__ float scratch[kRowThreads / 32];
  RmsnormBackwardInputRow<S, kRowThreads>(x, w, rstd, dy, dim, accumulate, dx, scratch);
}

__global__ void __launch_bounds__(kDwThreads)
    RmsnormDwPartialKernel(const bf16* x, const bf16* dy, const float* rstd, int64_t rows, int dim,
                           float* partials) {
  RmsnormDwPartialThread<S>(blockIdx.y, ColumnIndex(blockIdx.x, threadIdx.x, kDwThreads), rows, dim,
                            x, dy, rstd, partials);
}

__global__ void __launch_bounds__(kDwThreads)
    RmsnormDwFinalKernel(const float* partials, int64_t groups, int dim, float* dw) {
  RmsnormDwFinalThread(ColumnIndex(blockIdx.x, threadIdx.x, kDwThreads), groups, dim, partials, dw);
}

dim3 Grid(const LaunchShape& shape) {
  return dim3(static_cast<unsigned>(shape.blocks_x), static_cast<unsigned>(shape.blocks_y), 1);
}

}  // namespace

namespace launch {

cudaError_t RmsnormForward(const bf16* x, const bf16* w, int64_t rows, int dim, float eps, bf16* y,
                           float* rstd, cudaStream_t stream) {
  const LaunchShape shape = RowGrid(rows);
  RmsnormForwardKernel<<<Grid(shape), shape.threads, 0, stream>>>(x, w, dim, eps, y, rstd);
  return cudaGetLastError();
}

cudaError_t RmsnormBackward(const bf16* x, const bf16* w, const float* rstd, const bf16* dy,
                            int64_t rows, int dim, bool accumulate_dx, bf16* dx, float* dw_partials,
                            float* dw, cudaStream_t stream) {
  const LaunchShape rows_shape = RowGrid(rows);
  RmsnormBackwardInputKernel<<<Grid(rows_shape), rows_shape.threads, 0, stream>>>(
      x, w, rstd, dy, dim, accumulate_dx, dx);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchShape partial_shape = DwPartialGrid(rows, dim);
  RmsnormDwPartialKernel<<<Grid(partial_shape), partial_shape.threads, 0, stream>>>(
      x, dy, rstd, rows, dim, dw_partials);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchShape final_shape = DwFinalGrid(dim);
  RmsnormDwFinalKernel<<<Grid(final_shape), final_shape.threads, 0, stream>>>(
      dw_partials, DwRowGroups(rows), dim, dw);
  return cudaGetLastError();
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
