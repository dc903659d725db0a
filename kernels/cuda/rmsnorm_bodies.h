// Per-block bodies of the CUDA RMSNorm row kernels (forward; backward dx),
// templated on the storage policy S (see thread_bodies.h): rmsnorm.cu runs
// them on bf16, block_bodies_test under the host block emulator. Block b owns
// row b; `scratch` is the kernel's __shared__ float[kThreads / 32].
#pragma once

#include <cstdint>

#include "kernels/common/rmsnorm.h"
#include "kernels/cuda/block_reduce.h"
#include "kernels/cuda/device_shim.h"
#include "kernels/cuda/launch_geometry.h"

namespace megatrain::kernels::cuda {

// y = x * rstd * w over the row; rstd[row] saved for the backward.
template <class S, int kThreads>
MT_DEVICE void RmsnormForwardRow(const typename S::T* x, const typename S::T* w, int dim, float eps,
                                 typename S::T* y, float* rstd, float* scratch) {
  const int64_t row = MT_BLOCK_X();
  const int64_t row_offset = row * dim;
  const typename S::T* x_row = x + row_offset;
  float sum_squares = 0.0f;
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < dim; c += RowColumnStride(kThreads)) {
    const float v = S::Load(x_row[c]);
    sum_squares += v * v;
  }
  sum_squares = BlockSum<kThreads>(sum_squares, scratch);
  const float r = RmsnormRstd(sum_squares, dim, eps);
  if (MT_THREAD_X() == 0) rstd[row] = r;
  typename S::T* y_row = y + row_offset;
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < dim; c += RowColumnStride(kThreads)) {
    y_row[c] = S::Make(RmsnormForward(S::Load(x_row[c]), r, S::Load(w[c])));
  }
}

// dx of the row (added to dx when accumulate) from the saved rstd.
template <class S, int kThreads>
MT_DEVICE void RmsnormBackwardInputRow(const typename S::T* x, const typename S::T* w,
                                       const float* rstd, const typename S::T* dy, int dim,
                                       bool accumulate, typename S::T* dx, float* scratch) {
  const int64_t row = MT_BLOCK_X();
  const int64_t row_offset = row * dim;
  const typename S::T* x_row = x + row_offset;
  const typename S::T* dy_row = dy + row_offset;
  float dot = 0.0f;
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < dim; c += RowColumnStride(kThreads)) {
    dot += S::Load(w[c]) * S::Load(dy_row[c]) * S::Load(x_row[c]);
  }
  dot = BlockSum<kThreads>(dot, scratch);
  const float r = rstd[row];
  typename S::T* dx_row = dx + row_offset;
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < dim; c += RowColumnStride(kThreads)) {
    float g =
        RmsnormBackwardInput(S::Load(x_row[c]), S::Load(w[c]), S::Load(dy_row[c]), r, dot, dim);
    if (accumulate) g += S::Load(dx_row[c]);
    dx_row[c] = S::Make(g);
  }
}

}  // namespace megatrain::kernels::cuda
