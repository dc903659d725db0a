// Deterministic block-wide reductions for the row-per-block kernels: a warp
// butterfly (every lane ends with the same bits, since each step adds the same
// two values) then the warps' results folded in warp order by every thread.
// No atomics; the order depends only on blockDim, which is a constant.
#pragma once

#include "kernels/common/softmax.h"

namespace megatrain::kernels::cuda {

inline constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// Sum over the kLanes consecutive lanes that share one attention row.
template <int kLanes>
__device__ __forceinline__ float LaneGroupSum(float v) {
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullWarp, v, offset);
  }
  return v;
}

// Every thread of the block must call it; `scratch` holds kThreads / 32
// floats. Returns the block total in every thread.
template <int kThreads>
__device__ float BlockSum(float v, float* scratch) {
  static_assert(kThreads % 32 == 0, "whole warps only");
  v = WarpSum(v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused right after
  return total;
}

// Merges every thread's OnlineSoftmax state; returns the block's state in
// every thread. `scratch` holds kThreads / 32 states.
template <int kThreads>
__device__ OnlineSoftmax BlockSoftmaxMerge(OnlineSoftmax s, OnlineSoftmax* scratch) {
  static_assert(kThreads % 32 == 0, "whole warps only");
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(kFullWarp, s.max, offset);
    const float other_sum = __shfl_xor_sync(kFullWarp, s.sum, offset);
    OnlineSoftmaxMerge(&s, other_max, other_sum);
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  OnlineSoftmax total;
  for (int w = 0; w < kThreads / 32; ++w)
    OnlineSoftmaxMerge(&total, scratch[w].max, scratch[w].sum);
  __syncthreads();
  return total;
}

}  // namespace megatrain::kernels::cuda
