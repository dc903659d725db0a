// CUDA cross-entropy over a logits chunk: one block per row (log-sum-exp by
// merging OnlineSoftmax states, then dlogits), then one block summing the row
// losses in row order.
#include <cmath>

#include "kernels/common/cross_entropy.h"
#include "kernels/common/softmax.h"
#include "kernels/cuda/bf16_storage.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

// Ignored rows (target < 0) get loss 0 and zero gradient; a target >= vocab
// (a caller bug the kernel cannot report) gets a NaN loss so the non-finite
// check catches it, and zero gradient. dlogits may alias logits: each element
// is read and then written by the same thread.
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyRowKernel(const bf16* logits, const int32_t* targets, int64_t vocab, float scale,
                          bf16* dlogits, float* row_loss) {
  __shared__ OnlineSoftmax scratch[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const bf16* in = logits + row * vocab;
  bf16* out = dlogits + row * vocab;
  const int64_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  if (!valid) {
    for (int64_t c = RowFirstColumn(threadIdx.x); c < vocab; c += RowColumnStride(kRowThreads)) {
      out[c] = S::Make(0.0f);
    }
    if (threadIdx.x == 0) row_loss[row] = target < 0 ? 0.0f : NAN;
    return;  // uniform across the block: no barrier is skipped by only some threads
  }
  OnlineSoftmax state;
  for (int64_t c = RowFirstColumn(threadIdx.x); c < vocab; c += RowColumnStride(kRowThreads)) {
    OnlineSoftmaxMerge(&state, S::Load(in[c]), 1.0f);
  }
  state = BlockSoftmaxMerge<kRowThreads>(state, scratch);
  const float lse = OnlineSoftmaxLogSumExp(state);
  // Read the target logit before any thread overwrites it (in-place case).
  const float target_logit = S::Load(in[target]);
  __syncthreads();
  for (int64_t c = RowFirstColumn(threadIdx.x); c < vocab; c += RowColumnStride(kRowThreads)) {
    out[c] = S::Make(CrossEntropyLogitGrad(S::Load(in[c]), lse, c == target, scale));
  }
  if (threadIdx.x == 0) row_loss[row] = CrossEntropyRowLoss(lse, target_logit);
}

__global__ void __launch_bounds__(kSumThreads)
    OrderedSumKernel(const float* values, int64_t n, float* total) {
  __shared__ float scratch[kSumThreads / 32];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) sum += values[i];
  sum = BlockSum<kSumThreads>(sum, scratch);
  if (threadIdx.x == 0) *total = sum;
}

}  // namespace

namespace launch {

cudaError_t CrossEntropy(const bf16* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         float scale, bf16* dlogits, float* row_loss, float* loss_sum,
                         cudaStream_t stream) {
  const LaunchShape shape = RowGrid(rows);
  CrossEntropyRowKernel<<<static_cast<unsigned>(shape.blocks_x), shape.threads, 0, stream>>>(
      logits, targets, vocab, scale, dlogits, row_loss);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  OrderedSumKernel<<<1, kSumThreads, 0, stream>>>(row_loss, rows, loss_sum);
  return cudaGetLastError();
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
