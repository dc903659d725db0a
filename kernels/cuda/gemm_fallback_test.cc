// The fallback GEMM's per-output bodies replayed on the CPU over the kernels'
// grids (every block, thread and grid-stride row; every warp, lane and shuffle
// round) against a double reference on odd shapes, both output types, beta = 0
// over NaN and beta = 1; runs here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/cuda/gemm_fallback_body.h"

namespace megatrain::kernels::cuda {
namespace {

std::vector<uint16_t> Bf16Values(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t state = seed * 2654435761u + 3u;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    x = Float32ToBf16Bits(static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2 - 1);
  }
  return v;
}

// The warp kernel on the CPU: every warp of the grid-stride loop, each lane's partial, then
// __shfl_down_sync's tree (lane l adds lane l + offset's value of the previous round).
void ReplayWarpGrid(const FallbackGemmParams& p) {
  const int64_t blocks = FallbackGemmWarpBlocks(p.m, p.n);
  const int64_t stride = blocks * kFallbackWarpsPerBlock;
  for (int64_t first = 0; first < stride; ++first) {
    for (int64_t w = first; w < p.m * p.n; w += stride) {
      const int64_t i = w / p.n, j = w % p.n;
      float lanes[kWarpLanes];
      for (int l = 0; l < kWarpLanes; ++l) lanes[l] = FallbackGemmLanePartial(p, i, j, l);
      for (int offset = kWarpLanes / 2; offset > 0; offset /= 2) {
        for (int l = 0; l + offset < kWarpLanes; ++l) lanes[l] += lanes[l + offset];
      }
      FallbackGemmStore(p, i, j, lanes[0]);
    }
  }
}

// Runs the kernel's thread mapping on the CPU: every (block, thread) of the grid, the y loop.
void ReplayGrid(const FallbackGemmParams& p) {
  if (FallbackGemmUsesWarps(p.k)) {
    ReplayWarpGrid(p);
    return;
  }
  const FallbackGemmGrid g = FallbackGemmGridFor(p.m, p.n);
  for (int64_t by = 0; by < g.blocks_y; ++by) {
    for (int64_t bx = 0; bx < g.blocks_x; ++bx) {
      for (int ty = 0; ty < kFallbackGemmTile; ++ty) {
        for (int tx = 0; tx < kFallbackGemmTile; ++tx) {
          const int64_t j = bx * kFallbackGemmTile + tx;
          if (j >= p.n) continue;
          for (int64_t i = by * kFallbackGemmTile + ty; i < p.m;
               i += g.blocks_y * kFallbackGemmTile) {
            FallbackGemmElement(p, i, j);
          }
        }
      }
    }
  }
}

TEST(GemmFallbackTest, EveryOutputMatchesTheReferenceOnOddShapes) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{37, 75, 99}, Shape{99, 97, 37}, Shape{37, 99, 1}, Shape{75, 1, 37},
                  Shape{1, 1, 1}, Shape{17, 33, 0},
                  // warp per output: a bias gradient (n = 1, k = tokens) and a long odd k
                  Shape{75, 1, 301}, Shape{13, 7, 128}}) {
    for (int t = 0; t < 4; ++t) {
      for (bool fp32 : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          FallbackGemmParams p;
          p.m = s.m;
          p.n = s.n;
          p.k = s.k;
          p.transpose_a = (t & 1) != 0;
          p.transpose_b = (t & 2) != 0;
          const auto a = Bf16Values(static_cast<size_t>(s.m * s.k), 1 + t);
          const auto b = Bf16Values(static_cast<size_t>(s.k * s.n), 5 + t);
          p.a = a.data();
          p.b = b.data();
          p.c_fp32 = fp32;
          p.alpha = 0.5f;
          p.beta = beta;
          const size_t outputs = static_cast<size_t>(s.m * s.n);
          const float prior = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : 0.25f;
          std::vector<float> c32(outputs, prior);
          std::vector<uint16_t> c16(outputs, Float32ToBf16Bits(prior));
          p.c = fp32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
          ReplayGrid(p);
          int misses = 0;
          for (int64_t i = 0; i < s.m && misses < 5; ++i) {
            for (int64_t j = 0; j < s.n && misses < 5; ++j) {
              double want = 0.0;
              for (int64_t q = 0; q < s.k; ++q) {
                const uint16_t av = p.transpose_a ? a[q * s.m + i] : a[i * s.k + q];
                const uint16_t bv = p.transpose_b ? b[j * s.k + q] : b[q * s.n + j];
                want += double{Bf16BitsToFloat32(av)} * Bf16BitsToFloat32(bv);
              }
              want = 0.5 * want + (beta == 0.0f ? 0.0 : 0.25);
              const size_t at = static_cast<size_t>(i * s.n + j);
              const double got = fp32 ? c32[at] : Bf16BitsToFloat32(c16[at]);
              // fp32 sums of <= 301 products in [-1, 1]; bf16 output rounds once (2^-9 relative).
              const double bound = (fp32 ? 1e-5 : 4e-3) * std::fabs(want) + 1e-4 * (s.k + 1);
              if (!(std::fabs(got - want) <= bound)) {
                ADD_FAILURE() << "m,n,k=" << s.m << "," << s.n << "," << s.k << " t=" << t
                              << " fp32=" << fp32 << " beta=" << beta << " C[" << i << "," << j
                              << "] = " << got << ", want " << want;
                ++misses;
              }
            }
          }
        }
      }
    }
  }
}

// C != D (y = residual + x W^T without a copy): beta * C comes from c_source, D is only written.
TEST(GemmFallbackTest, SeparateSourceIsReadAndLeftUnchanged) {
  for (int64_t k : {int64_t{5}, int64_t{200}}) {  // both kernels
    FallbackGemmParams p;
    p.m = 3;
    p.n = 4;
    p.k = k;
    const auto a = Bf16Values(static_cast<size_t>(p.m * k), 21);
    const auto b = Bf16Values(static_cast<size_t>(k * p.n), 22);
    const std::vector<uint16_t> source(12, Float32ToBf16Bits(0.25f));
    std::vector<uint16_t> d(12, Float32ToBf16Bits(std::numeric_limits<float>::quiet_NaN()));
    p.a = a.data();
    p.b = b.data();
    p.c_source = source.data();
    p.c = d.data();
    p.beta = 1.0f;
    ReplayGrid(p);
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        double want = 0.25;
        for (int64_t q = 0; q < k; ++q) {
          want += double{Bf16BitsToFloat32(a[i * k + q])} * Bf16BitsToFloat32(b[q * p.n + j]);
        }
        EXPECT_NEAR(Bf16BitsToFloat32(d[i * p.n + j]), want, 4e-3 * std::fabs(want) + 1e-3)
            << "k=" << k << " C[" << i << "," << j << "]";
      }
    }
    for (uint16_t v : source) EXPECT_EQ(v, Float32ToBf16Bits(0.25f));
  }
}

TEST(GemmFallbackTest, LongKUsesAWarpPerOutput) {
  EXPECT_FALSE(FallbackGemmUsesWarps(99));
  EXPECT_TRUE(FallbackGemmUsesWarps(kFallbackWarpMinK));
  EXPECT_EQ(FallbackGemmWarpBlocks(75, 1), 10);
  EXPECT_EQ(FallbackGemmWarpBlocks(int64_t{1} << 30, 4), kFallbackMaxWarpBlocks);
}

TEST(GemmFallbackTest, GridCoversEveryColumnAndCapsRowsWithAStride) {
  const FallbackGemmGrid small = FallbackGemmGridFor(37, 99);
  EXPECT_EQ(small.blocks_x, 7);
  EXPECT_EQ(small.blocks_y, 3);
  const FallbackGemmGrid tall = FallbackGemmGridFor(int64_t{2} << 20, 1);
  EXPECT_EQ(tall.blocks_x, 1);
  EXPECT_EQ(tall.blocks_y, kMaxGridY);
}

}  // namespace
}  // namespace megatrain::kernels::cuda
