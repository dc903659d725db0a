// MapRowMajorGemm and PointerAlignment: the layout arithmetic behind every
// cuBLASLt call, kept free of CUDA so it is tested on the CPU.
#include "kernels/cuda/gemm_mapping.h"

namespace megatrain::kernels::cuda {

CublasLtMapping MapRowMajorGemm(const GemmShape& s) {
  CublasLtMapping map;
  // Column-major view: C^T[n, m] = op(B)^T[n, k] * op(A)^T[k, m].
  map.transpose_lt_a = s.transpose_b;
  map.transpose_lt_b = s.transpose_a;
  // Our B stored row-major [n, k] (transpose_b) reads column-major as [k, n]; else [k, n] as [n,
  // k].
  map.lt_a = s.transpose_b ? ColumnMajorLayout{s.k, s.n, s.k} : ColumnMajorLayout{s.n, s.k, s.n};
  // Our A stored row-major [k, m] (transpose_a) reads column-major as [m, k]; else [m, k] as [k,
  // m].
  map.lt_b = s.transpose_a ? ColumnMajorLayout{s.m, s.k, s.m} : ColumnMajorLayout{s.k, s.m, s.k};
  map.c = ColumnMajorLayout{s.n, s.m, s.n};
  return map;
}

uint32_t PointerAlignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace megatrain::kernels::cuda
