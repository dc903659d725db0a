// The fallback GEMM's per-output work and grids, host-compilable: the .cu
// kernels run FallbackGemmElement once per thread (short k) or
// FallbackGemmLanePartial once per lane of a warp (long k); gemm_fallback_test
// replays both on the CPU over every output of odd shapes.
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
  const void* c_source = nullptr;  // where beta * C is read from; null: c
  bool c_fp32 = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

MT_HD float FallbackGemmA(const FallbackGemmParams& p, int64_t i, int64_t q) {
  return Bf16BitsToFloat32(p.transpose_a ? p.a[q * p.m + i] : p.a[i * p.k + q]);
}

MT_HD float FallbackGemmB(const FallbackGemmParams& p, int64_t q, int64_t j) {
  return Bf16BitsToFloat32(p.transpose_b ? p.b[j * p.k + q] : p.b[q * p.n + j]);
}

// D[i, j] = alpha * sum + beta * C[i, j], D = c, C = c_source or c (not read when beta == 0).
MT_HD void FallbackGemmStore(const FallbackGemmParams& p, int64_t i, int64_t j, float sum) {
  float out = p.alpha * sum;
  const int64_t at = i * p.n + j;
  const void* source = p.c_source != nullptr ? p.c_source : p.c;
  if (p.c_fp32) {
    if (p.beta != 0.0f) out += p.beta * static_cast<const float*>(source)[at];
    static_cast<float*>(p.c)[at] = out;
  } else {
    if (p.beta != 0.0f) out += p.beta * Bf16BitsToFloat32(static_cast<const uint16_t*>(source)[at]);
    static_cast<uint16_t*>(p.c)[at] = Float32ToBf16Bits(out);
  }
}

// Thread per output (k < kFallbackWarpMinK): one fp32 sum over k in index
// order. Deterministic, and the same result whatever the grid.
MT_HD void FallbackGemmElement(const FallbackGemmParams& p, int64_t i, int64_t j) {
  float sum = 0.0f;
  for (int64_t q = 0; q < p.k; ++q) sum += FallbackGemmA(p, i, q) * FallbackGemmB(p, q, j);
  FallbackGemmStore(p, i, j, sum);
}

// Warp per output (k >= kFallbackWarpMinK, e.g. a bias gradient: n = 1,
// k = tokens): lane l sums q = l, l + 32, ... in order; the kernel then adds
// the lanes with __shfl_down_sync at offsets 16, 8, 4, 2, 1 (a fixed tree, so
// deterministic) and lane 0 stores.
inline constexpr int kWarpLanes = 32;
inline constexpr int64_t kFallbackWarpMinK = 128;

MT_HD bool FallbackGemmUsesWarps(int64_t k) { return k >= kFallbackWarpMinK; }

MT_HD float FallbackGemmLanePartial(const FallbackGemmParams& p, int64_t i, int64_t j, int lane) {
  float sum = 0.0f;
  for (int64_t q = lane; q < p.k; q += kWarpLanes) {
    sum += FallbackGemmA(p, i, q) * FallbackGemmB(p, q, j);
  }
  return sum;
}

// Warp kernel geometry: 8 warps per block, a grid-stride loop over outputs.
inline constexpr int kFallbackWarpsPerBlock = 8;
inline constexpr int64_t kFallbackMaxWarpBlocks = int64_t{1} << 20;

inline int64_t FallbackGemmWarpBlocks(int64_t m, int64_t n) {
  const int64_t blocks = (m * n + kFallbackWarpsPerBlock - 1) / kFallbackWarpsPerBlock;
  return blocks < kFallbackMaxWarpBlocks ? blocks : kFallbackMaxWarpBlocks;
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
