// The row-major -> cuBLASLt column-major mapping of a GEMM as plain data: which
// operand cuBLASLt sees as "A" and "B", their transposes, and each matrix's
// stored (rows, cols, leading dimension). Host-only, no CUDA: gemm_plan.cc turns
// it into cuBLASLt layouts, gemm_mapping_test replays it on a naive CPU GEMM.
#pragma once

#include <cstdint>

namespace megatrain::kernels::cuda {

// Row-major C[m, n] = op(A)[m, k] * op(B)[k, n]; A stored [m, k] ([k, m] when
// transpose_a), B [k, n] ([n, k] when transpose_b), all densely packed.
struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
};

// A column-major matrix as stored: element (r, c) at data[r + c * ld].
struct ColumnMajorLayout {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};

// What cuBLASLt is asked for: column-major D[rows_c, cols_c] =
// op(lt_a) * op(lt_b) with lt_a = our B and lt_b = our A (a row-major [r, c]
// matrix read column-major is its transpose [c, r], so C^T = op(B)^T op(A)^T
// needs no data movement).
struct CublasLtMapping {
  bool transpose_lt_a = false;  // CUBLASLT_MATMUL_DESC_TRANSA
  bool transpose_lt_b = false;  // CUBLASLT_MATMUL_DESC_TRANSB
  ColumnMajorLayout lt_a;       // our B
  ColumnMajorLayout lt_b;       // our A
  ColumnMajorLayout c;          // our C (also D)
};

CublasLtMapping MapRowMajorGemm(const GemmShape& shape);

// Largest power of two (<= 16) dividing the address: what cuBLASLt may assume
// about the pointer. Capped at 16 bytes (all a Hopper tensor-core kernel
// needs) so the kernel chosen, and with it the bits of the result, do not
// depend on where a tensor sits in a slot, the ring or a vocabulary block.
uint32_t PointerAlignment(const void* p);

}  // namespace megatrain::kernels::cuda
