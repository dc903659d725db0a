// A host-only CUDA block emulator for tests: runs a kernel body for every
// (block, thread) of a grid, one fiber (its own stack, ucontext) per thread of
// a block, all on the calling thread, with real __syncthreads semantics (a
// barrier that checks every thread reached the same barrier), per-block shared
// memory, and warp shuffles through a per-block exchange array. Blocks run one
// after another and, between two barriers, the threads of a block run one after
// another, in thread order in even blocks and in reverse in odd ones, so
// results are deterministic and a missing barrier shows (as a read of the
// poison or of a value overwritten too early) whichever way round the two
// threads of the race are, as soon as the grid has two blocks.
//
// The bodies reach the emulator through kernels/cuda/device_shim.h, whose host
// side calls the Emulated* functions below; they act on the running fiber's
// emulated context (a thread_local set only while a Run is in progress: the
// CUDA builtins it stands for are implicit per-thread state too). Separate
// host threads may run grids concurrently.
//
// Limits (stricter than CUDA, so a body that passes here is also legal there):
// a shuffle is a block-wide step, so every thread of the block must shuffle
// the same number of times (all bodies here shuffle block-uniformly); blocks
// must be whole warps when a body shuffles; only the full-warp mask is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace megatrain::kernels::cuda::testing {

struct EmulatedGrid {
  int64_t blocks_x = 1;
  int64_t blocks_y = 1;
  int threads = 1;          // blockDim.x (1-D blocks)
  size_t shared_bytes = 0;  // per block; filled with 0xff bytes (NaN floats) at each block start
};

// The position of the calling thread, as the CUDA builtins would give it.
struct EmulatedThread {
  int64_t block_x = 0;
  int64_t block_y = 0;
  int thread = 0;
  int threads = 0;
  void* shared = nullptr;  // this block's shared memory
};

// Runs body for every thread of every block (y-major, then x). Returns
// FailedPrecondition naming the block and the threads when threads of a block
// reach different barriers (a divergent __syncthreads or shuffle, a hang or
// undefined behaviour on a GPU), or when a shuffle breaks the limits above.
absl::Status RunEmulatedGrid(const EmulatedGrid& grid,
                             const std::function<void(const EmulatedThread&)>& body);

// ---- What device_shim.h maps the CUDA builtins to on the host. Only valid
// inside a body run by RunEmulatedGrid (CHECK-fails otherwise). ----
unsigned EmulatedThreadX();  // unsigned, like threadIdx.x
unsigned EmulatedBlockDimX();
int64_t EmulatedBlockX();
int64_t EmulatedBlockY();
void EmulatedSyncThreads();
float EmulatedShflXor(unsigned mask, float value, int lane_mask);
float EmulatedShflDown(unsigned mask, float value, int delta);

}  // namespace megatrain::kernels::cuda::testing
