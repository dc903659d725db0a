// The bf16 storage policy the .cu kernels instantiate thread_bodies.h with:
// bf16 in memory, fp32 arithmetic, round-to-nearest-even on store. Host-compilable
// (cuda_bf16.h): bf16_storage_test checks it bitwise against kernels/common/bf16.h.
#pragma once

#include <cuda_bf16.h>

namespace megatrain::kernels::cuda {

struct Bf16Storage {
  using T = __nv_bfloat16;
  __host__ __device__ __forceinline__ static float Load(T v) { return __bfloat162float(v); }
  __host__ __device__ __forceinline__ static T Make(float v) { return __float2bfloat16_rn(v); }
};

}  // namespace megatrain::kernels::cuda
