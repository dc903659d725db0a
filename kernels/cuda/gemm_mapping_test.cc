// MapRowMajorGemm replayed on a naive column-major GEMM (what cuBLASLt
// computes from the mapping) against the row-major product it stands for, on
// odd shapes and every transpose pair; runs on the CPU.
#include "kernels/cuda/gemm_mapping.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace megatrain::kernels::cuda {
namespace {

// Column-major D = op(A) * op(B) as cuBLAS defines it, reading only through the layouts.
std::vector<double> NaiveColumnMajorGemm(const CublasLtMapping& map, const std::vector<double>& a,
                                         const std::vector<double>& b) {
  const int64_t rows = map.transpose_lt_a ? map.lt_a.cols : map.lt_a.rows;
  const int64_t inner = map.transpose_lt_a ? map.lt_a.rows : map.lt_a.cols;
  const int64_t cols = map.transpose_lt_b ? map.lt_b.rows : map.lt_b.cols;
  const int64_t inner_b = map.transpose_lt_b ? map.lt_b.cols : map.lt_b.rows;
  EXPECT_EQ(inner, inner_b);
  EXPECT_EQ(rows, map.c.rows);
  EXPECT_EQ(cols, map.c.cols);
  // Leading dimensions must cover the stored rows, and the storage must hold exactly the operand.
  EXPECT_GE(map.lt_a.ld, map.lt_a.rows);
  EXPECT_GE(map.lt_b.ld, map.lt_b.rows);
  EXPECT_GE(map.c.ld, map.c.rows);
  EXPECT_EQ(static_cast<size_t>(map.lt_a.ld * map.lt_a.cols), a.size());
  EXPECT_EQ(static_cast<size_t>(map.lt_b.ld * map.lt_b.cols), b.size());
  std::vector<double> d(static_cast<size_t>(map.c.ld * map.c.cols), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < inner; ++p) {
        const double av = map.transpose_lt_a ? a[p + i * map.lt_a.ld] : a[i + p * map.lt_a.ld];
        const double bv = map.transpose_lt_b ? b[j + p * map.lt_b.ld] : b[p + j * map.lt_b.ld];
        sum += av * bv;
      }
      d[i + j * map.c.ld] = sum;
    }
  }
  return d;
}

std::vector<double> Values(size_t n, uint32_t seed) {
  std::vector<double> v(n);
  uint32_t state = seed * 2654435761u + 7u;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<double>(static_cast<int32_t>(state >> 20) - 2048);  // exact small integers
  }
  return v;
}

TEST(GemmMappingTest, ColumnMajorReplayEqualsRowMajorProductOnOddShapes) {
  // The tests' odd model shapes (hidden 99, ffn 75, vocab 97), the k = 1 bias
  // broadcast and the n = 1 bias gradient, and degenerate 1 x 1 x 1.
  const GemmShape shapes[] = {{37, 75, 99}, {99, 97, 37}, {37, 99, 1},
                              {75, 1, 37},  {1, 1, 1},    {5, 3, 2}};
  for (GemmShape shape : shapes) {
    for (int t = 0; t < 4; ++t) {
      shape.transpose_a = (t & 1) != 0;
      shape.transpose_b = (t & 2) != 0;
      const int64_t m = shape.m, n = shape.n, k = shape.k;
      const std::vector<double> a = Values(static_cast<size_t>(m * k), 1 + t);
      const std::vector<double> b = Values(static_cast<size_t>(k * n), 11 + t);
      const CublasLtMapping map = MapRowMajorGemm(shape);
      const std::vector<double> got = NaiveColumnMajorGemm(map, /*lt_a=*/b, /*lt_b=*/a);
      ASSERT_EQ(got.size(), static_cast<size_t>(m * n));
      int misses = 0;
      for (int64_t i = 0; i < m && misses < 5; ++i) {
        for (int64_t j = 0; j < n && misses < 5; ++j) {
          double want = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            const double av = shape.transpose_a ? a[p * m + i] : a[i * k + p];
            const double bv = shape.transpose_b ? b[j * k + p] : b[p * n + j];
            want += av * bv;
          }
          if (got[i * n + j] != want) {  // row-major C[i, j]
            ADD_FAILURE() << "m,n,k=" << m << "," << n << "," << k << " ta=" << shape.transpose_a
                          << " tb=" << shape.transpose_b << " C[" << i << "," << j
                          << "] = " << got[i * n + j] << ", want " << want;
            ++misses;
          }
        }
      }
    }
  }
}

TEST(GemmMappingTest, LinearLayerProductsMapAsDocumented) {
  // y[t, out] = x[t, in] W[out, in]^T: cuBLAS "A" is W read as [in, out], transposed.
  const CublasLtMapping fwd = MapRowMajorGemm({/*m=*/37, /*n=*/75, /*k=*/99, false, true});
  EXPECT_TRUE(fwd.transpose_lt_a);
  EXPECT_FALSE(fwd.transpose_lt_b);
  EXPECT_EQ(fwd.lt_a.rows, 99);
  EXPECT_EQ(fwd.lt_a.cols, 75);
  EXPECT_EQ(fwd.lt_a.ld, 99);
  EXPECT_EQ(fwd.lt_b.rows, 99);
  EXPECT_EQ(fwd.lt_b.cols, 37);
  EXPECT_EQ(fwd.c.rows, 75);
  EXPECT_EQ(fwd.c.cols, 37);
  EXPECT_EQ(fwd.c.ld, 75);
}

TEST(GemmMappingTest, PointerAlignmentIsCappedAtSixteen) {
  EXPECT_EQ(PointerAlignment(reinterpret_cast<void*>(0x1000)), 16u);
  EXPECT_EQ(PointerAlignment(reinterpret_cast<void*>(0x1008)), 8u);
  EXPECT_EQ(PointerAlignment(reinterpret_cast<void*>(0x1002)), 2u);  // a bf16 row of 99
  EXPECT_EQ(PointerAlignment(reinterpret_cast<void*>(0x1001)), 1u);
}

}  // namespace
}  // namespace megatrain::kernels::cuda
