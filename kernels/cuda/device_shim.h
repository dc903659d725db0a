// The CUDA builtins the block bodies use (thread/block index, __syncthreads,
// warp shuffles), as macros: the intrinsics under nvcc, the block emulator
// (kernels/cuda/testing) under a host compiler, so one body runs on both.
// MT_THREAD_X(), MT_BLOCK_DIM_X() and MT_BLOCK_Y() are unsigned like
// threadIdx.x and blockIdx.y, so the bodies compile to the same code as when
// they used the builtins directly. MT_UNROLL is `#pragma unroll` for nvcc and
// nothing for the host compiler (which would warn about an unknown pragma).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

#define MT_DEVICE __device__ __forceinline__
#define MT_DEVICE_FN __device__  // inlining left to the compiler
#define MT_THREAD_X() (threadIdx.x)
#define MT_BLOCK_DIM_X() (blockDim.x)
#define MT_BLOCK_X() (static_cast<int64_t>(blockIdx.x))
#define MT_BLOCK_Y() (blockIdx.y)
#define MT_UNROLL _Pragma("unroll")
#define MT_SYNC_THREADS() __syncthreads()
#define MT_SHFL_XOR(mask, value, lane_mask) __shfl_xor_sync((mask), (value), (lane_mask))

#else

#include "kernels/cuda/testing/block_emulator.h"

#define MT_DEVICE inline
#define MT_DEVICE_FN inline
#define MT_THREAD_X() (::megatrain::kernels::cuda::testing::EmulatedThreadX())
#define MT_BLOCK_DIM_X() (::megatrain::kernels::cuda::testing::EmulatedBlockDimX())
#define MT_BLOCK_X() (::megatrain::kernels::cuda::testing::EmulatedBlockX())
#define MT_BLOCK_Y() (static_cast<unsigned>(::megatrain::kernels::cuda::testing::EmulatedBlockY()))
#define MT_UNROLL
#define MT_SYNC_THREADS() (::megatrain::kernels::cuda::testing::EmulatedSyncThreads())
#define MT_SHFL_XOR(mask, value, lane_mask) \
  (::megatrain::kernels::cuda::testing::EmulatedShflXor((mask), (value), (lane_mask)))

#endif
