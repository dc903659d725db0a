// CUDA RMSNorm: forward (one block per row, saves rstd) and backward (dx one
// block per row; dw by fixed row groups -> partials -> in-order final sum).
#include "kernels/common/rmsnorm.h"
#include "kernels/cuda/bf16_storage.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/thread_bodies.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

__global__ void __launch_bounds__(kRowThreads)
    RmsnormForwardKernel(const bf16* x, const bf16* w, int dim, float eps, bf16* y, float* rstd) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * dim;
  const bf16* x_row = x + row_offset;
  float sum_squares = 0.0f;
  for (int64_t c = RowFirstColumn(threadIdx.x); c < dim; c += RowColumnStride(kRowThreads)) {
    const float v = S::Load(x_row[c]);
    sum_squares += v * v;
  }
  sum_squares = BlockSum<kRowThreads>(sum_squares, scratch);
  const float r = RmsnormRstd(sum_squares, dim, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  bf16* y_row = y + row_offset;
  for (int64_t c = RowFirstColumn(threadIdx.x); c < dim; c += RowColumnStride(kRowThreads)) {
    y_row[c] = S::Make(RmsnormForward(S::Load(x_row[c]), r, S::Load(w[c])));
  }
}

__global__ void __launch_bounds__(kRowThreads)
    RmsnormBackwardInputKernel(const bf16* x, const bf16* w, const float* rstd, const bf16* dy,
                               int dim, bool accumulate, bf16* dx) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * dim;
  const bf16* x_row = x + row_offset;
  const bf16* dy_row = dy + row_offset;
  float dot = 0.0f;
  for (int64_t c = RowFirstColumn(threadIdx.x); c < dim; c += RowColumnStride(kRowThreads)) {
    dot += S::Load(w[c]) * S::Load(dy_row[c]) * S::Load(x_row[c]);
  }
  dot = BlockSum<kRowThreads>(dot, scratch);
  const float r = rstd[blockIdx.x];
  bf16* dx_row = dx + row_offset;
  for (int64_t c = RowFirstColumn(threadIdx.x); c < dim; c += RowColumnStride(kRowThreads)) {
    float g =
        RmsnormBackwardInput(S::Load(x_row[c]), S::Load(w[c]), S::Load(dy_row[c]), r, dot, dim);
    if (accumulate) g += S::Load(dx_row[c]);
    dx_row[c] = S::Make(g);
  }
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
