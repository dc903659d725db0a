// RMSNorm over the last axis: forward saving rstd, backward accumulating dx and dw.
#include "kernels/cpu/rmsnorm.h"

#include "kernels/common/rmsnorm.h"
#include "kernels/cpu/ordered_sum.h"

namespace megatrain::kernels::cpu {

void RmsnormForward(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps,
                    float* y, float* rstd) {
  const int dim_int = static_cast<int>(dim);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float row_rstd = kernels::RmsnormRstd(OrderedDot(xr, xr, dim), dim_int, eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = kernels::RmsnormForward(xr[i], row_rstd, w[i]);
    rstd[r] = row_rstd;
  }
}

void RmsnormBackward(const float* dy, const float* x, const float* w, const float* rstd,
                     int64_t n_rows, int64_t dim, float* dx, float* dw) {
  const int dim_int = static_cast<int>(dim);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float row_rstd = rstd[r];
    const float dot = OrderedDot3(w, dyr, xr, dim);
    for (int64_t i = 0; i < dim; ++i) {
      dxr[i] += kernels::RmsnormBackwardInput(xr[i], w[i], dyr[i], row_rstd, dot, dim_int);
      dw[i] += kernels::RmsnormBackwardWeight(xr[i], dyr[i], row_rstd);
    }
  }
}

}  // namespace megatrain::kernels::cpu
