// Dense layer y = x W^T (+ b) with HF weight layout, forward and backward via cblas_sgemm.
#include "kernels/cpu/linear.h"

#include <cblas.h>

namespace megatrain::kernels::cpu {

void LinearForward(const float* x, const float* w, const float* bias, int64_t n, int64_t in,
                   int64_t out, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
              static_cast<int>(in), 1.0f, x, static_cast<int>(in), w, static_cast<int>(in), 0.0f, y,
              static_cast<int>(out));
  if (bias == nullptr) return;
  for (int64_t r = 0; r < n; ++r) {
    float* yr = y + r * out;
    for (int64_t j = 0; j < out; ++j) yr[j] += bias[j];
  }
}

void LinearBackward(const float* dy, const float* x, const float* w, int64_t n, int64_t in,
                    int64_t out, float* dx, GradMode dx_mode, float* dw, float* db) {
  const int n_int = static_cast<int>(n);
  const int in_int = static_cast<int>(in);
  const int out_int = static_cast<int>(out);
  if (dx != nullptr) {
    const float beta = dx_mode == GradMode::kAccumulate ? 1.0f : 0.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_int, in_int, out_int, 1.0f, dy,
                out_int, w, in_int, beta, dx, in_int);
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_int, in_int, n_int, 1.0f, dy, out_int,
                x, in_int, 1.0f, dw, in_int);
  }
  if (db != nullptr) {
    for (int64_t r = 0; r < n; ++r) {
      const float* dyr = dy + r * out;
      for (int64_t j = 0; j < out; ++j) db[j] += dyr[j];
    }
  }
}

}  // namespace megatrain::kernels::cpu
