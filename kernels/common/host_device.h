// MT_HD: marks the element-wise math that both backends compile (nvcc and g++).
#pragma once

#if defined(__CUDACC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD inline
#endif
