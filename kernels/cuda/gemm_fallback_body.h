// The fallback GEMM's per-output work and grid, host-compilable: the .cu
// kernel runs FallbackGemmElement once per thread, gemm_fallback_test replays
// it on the CPU over every output of odd shapes.
#pragma once

#include <cstdint>

#include "kernels/common/bf16.h"
#include "kernels/common/host_device.h"

namespace megatrain::kernels::cuda {

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C with MatmulArgs' meaning:
// A, B bf16 bits, A stored [m, k] ([k, m] when transpose_a), B [k, n] ([n, k]
// when transpose_b). C is bf16 bits or fp32. beta == 0 never reads C (it may
// hold NaN), as cuBLAS.
struct FallbackGemmParams {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  void* c = nullptr;
  bool c_fp32 = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// One fp32 sum over k in index order per output: deterministic, and the same
// result whatever the grid.
MT_HD void FallbackGemmElement(const FallbackGemmParams& p, int64_t i, int64_t j) {
  float sum = 0.0f;
  for (int64_t q = 0; q < p.k; ++q) {
    const uint16_t a = p.transpose_a ? p.a[q * p.m + i] : p.a[i * p.k + q];
    const uint16_t b = p.transpose_b ? p.b[j * p.k + q] : p.b[q * p.n + j];
    sum += Bf16BitsToFloat32(a) * Bf16BitsToFloat32(b);
  }
  float out = p.alpha * sum;
  const int64_t at = i * p.n + j;
  if (p.c_fp32) {
    float* c = static_cast<float*>(p.c);
    if (p.beta != 0.0f) out += p.beta * c[at];
    c[at] = out;
  } else {
    uint16_t* c = static_cast<uint16_t*>(p.c);
    if (p.beta != 0.0f) out += p.beta * Bf16BitsToFloat32(c[at]);
    c[at] = Float32ToBf16Bits(out);
  }
}

// 16 x 16 threads per block: x runs along n (consecutive outputs of a row,
// coalesced C and non-transposed B), y along m with a grid-stride loop, so
// any m fits in gridDim.y <= 65535.
inline constexpr int kFallbackGemmTile = 16;
inline constexpr int64_t kMaxGridY = 65535;

struct FallbackGemmGrid {
  int64_t blocks_x = 0;
  int64_t blocks_y = 0;
};

inline FallbackGemmGrid FallbackGemmGridFor(int64_t m, int64_t n) {
  FallbackGemmGrid g;
  g.blocks_x = (n + kFallbackGemmTile - 1) / kFallbackGemmTile;
  const int64_t rows = (m + kFallbackGemmTile - 1) / kFallbackGemmTile;
  g.blocks_y = rows < kMaxGridY ? rows : kMaxGridY;
  return g;
}

}  // namespace megatrain::kernels::cuda
