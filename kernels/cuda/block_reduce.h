// Deterministic block-wide reductions for the row-per-block kernels: a warp
// butterfly (every lane ends with the same bits, since each step adds the same
// two values) then the warps' results folded in warp order by every thread.
// No atomics; the order depends only on blockDim, which is a constant.
// Compiled by nvcc for the kernels and by g++ under the block emulator
// (device_shim.h) for block_bodies_test.
#pragma once

#include "kernels/common/softmax.h"
#include "kernels/cuda/device_shim.h"

namespace megatrain::kernels::cuda {

inline constexpr unsigned kFullWarp = 0xffffffffu;

MT_DEVICE float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += MT_SHFL_XOR(kFullWarp, v, offset);
  return v;
}

// Sum over the kLanes consecutive lanes that share one attention row.
template <int kLanes>
MT_DEVICE float LaneGroupSum(float v) {
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
    v += MT_SHFL_XOR(kFullWarp, v, offset);
  }
  return v;
}

// Every thread of the block must call it; `scratch` holds kThreads / 32
// floats. Returns the block total in every thread.
template <int kThreads>
MT_DEVICE_FN float BlockSum(float v, float* scratch) {
  static_assert(kThreads % 32 == 0, "whole warps only");
  v = WarpSum(v);
  if (MT_THREAD_X() % 32 == 0) scratch[MT_THREAD_X() / 32] = v;
  MT_SYNC_THREADS();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  MT_SYNC_THREADS();  // scratch may be reused right after
  return total;
}

// Merges every thread's OnlineSoftmax state; returns the block's state in
// every thread. `scratch` holds kThreads / 32 states.
template <int kThreads>
MT_DEVICE_FN OnlineSoftmax BlockSoftmaxMerge(OnlineSoftmax s, OnlineSoftmax* scratch) {
  static_assert(kThreads % 32 == 0, "whole warps only");
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = MT_SHFL_XOR(kFullWarp, s.max, offset);
    const float other_sum = MT_SHFL_XOR(kFullWarp, s.sum, offset);
    OnlineSoftmaxMerge(&s, other_max, other_sum);
  }
  if (MT_THREAD_X() % 32 == 0) scratch[MT_THREAD_X() / 32] = s;
  MT_SYNC_THREADS();
  OnlineSoftmax total;
  for (int w = 0; w < kThreads / 32; ++w)
    OnlineSoftmaxMerge(&total, scratch[w].max, scratch[w].sum);
  MT_SYNC_THREADS();
  return total;
}

}  // namespace megatrain::kernels::cuda
