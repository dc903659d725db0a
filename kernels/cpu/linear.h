// Dense layer y = x W^T (+ b) with HF weight layout W [out_features, in_features],
// forward and backward, all GEMMs through one cblas_sgemm each (never split along K).
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

// y[n, out] = x[n, in] * w[out, in]^T + bias[out] (bias may be null). Overwrites y.
void LinearForward(const float* x, const float* w, const float* bias, int64_t n, int64_t in,
                   int64_t out, float* y);

enum class GradMode { kOverwrite, kAccumulate };

// Backward of LinearForward. Any of dx, dw, db may be null to skip it.
//   dx[n, in]   = dy * w            (overwrite or accumulate per dx_mode)
//   dw[out, in] += dy^T * x         (ACCUMULATES, sgemm beta = 1, K = n)
//   db[out]     += sum over rows of dy, rows added to db in increasing order
void LinearBackward(const float* dy, const float* x, const float* w, int64_t n, int64_t in,
                    int64_t out, float* dx, GradMode dx_mode, float* dw, float* db);

}  // namespace megatrain::kernels::cpu
