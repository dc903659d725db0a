// RMSNorm over the last axis: forward saving rstd, backward accumulating dx and dw.
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

// y[r, :] = x[r, :] * rstd[r] * w with rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps)
// (kernels/common/rmsnorm.h). x, y: [n_rows, dim]; w: [dim]; rstd: [n_rows]
// (written, kept for the backward). y may alias x.
void RmsnormForward(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps,
                    float* y, float* rstd);

// Given dy, the forward's x, w and rstd: dx[r, :] += d(loss)/dx (ACCUMULATES,
// the executor sums it into the residual gradient) and dw += sum over rows,
// rows added in increasing order (ACCUMULATES). dx must not alias dy or x.
void RmsnormBackward(const float* dy, const float* x, const float* w, const float* rstd,
                     int64_t n_rows, int64_t dim, float* dx, float* dw);

}  // namespace megatrain::kernels::cpu
