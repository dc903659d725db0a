// RMSNorm element formulas: y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps).
// The row reductions (sum of squares, sum of w*dy*x) are the callers'; they
// must run in a fixed order so results are deterministic.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

MT_HD float RmsnormRstd(float sum_squares, int dim, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
}

MT_HD float RmsnormForward(float x, float rstd, float w) { return (x * rstd) * w; }

// dx_i = rstd * (w_i dy_i - x_i * rstd^2 * dot / dim), dot = sum_j w_j dy_j x_j.
MT_HD float RmsnormBackwardInput(float x, float w, float dy, float rstd, float dot, int dim) {
  return rstd * (w * dy - x * (rstd * rstd) * (dot / static_cast<float>(dim)));
}

// Contribution of one row to dw_i: dy_i * x_i * rstd.
MT_HD float RmsnormBackwardWeight(float x, float dy, float rstd) { return dy * (x * rstd); }

}  // namespace megatrain::kernels
