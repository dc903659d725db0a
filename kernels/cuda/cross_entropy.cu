// CUDA cross-entropy over a logits chunk: one block per row (log-sum-exp by
// merging OnlineSoftmax states, then dlogits), then one block summing the row
// losses in row order. And the same over vocabulary blocks: each block's
// logits folded into per-row running states, the loss from the states once
// every block was seen, and each block's dlogits from them.
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

// One block per row of a vocabulary block's logits [rows, block_vocab]: the
// block's own state merged into the row's running state; the target's logit
// kept when it lies in the block. Ignored rows are skipped.
__global__ void __launch_bounds__(kRowThreads)
    HeadBlockStatsKernel(const bf16* logits, const int32_t* targets, int64_t block_vocab,
                         int64_t first_row, float* row_max, float* row_sum,
                         float* target_logit) {
  __shared__ OnlineSoftmax scratch[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  if (target < 0) return;  // uniform across the block
  const bf16* in = logits + row * block_vocab;
  OnlineSoftmax state;
  for (int64_t c = RowFirstColumn(threadIdx.x); c < block_vocab;
       c += RowColumnStride(kRowThreads)) {
    OnlineSoftmaxMerge(&state, S::Load(in[c]), 1.0f);
  }
  state = BlockSoftmaxMerge<kRowThreads>(state, scratch);
  if (threadIdx.x != 0) return;
  OnlineSoftmax running{row_max[row], row_sum[row]};
  OnlineSoftmaxMerge(&running, state.max, state.sum);
  row_max[row] = running.max;
  row_sum[row] = running.sum;
  if (target >= first_row && target < first_row + block_vocab) {
    target_logit[row] = S::Load(in[target - first_row]);
  }
}

// dlogits of one vocabulary block from the rows' final states; may alias logits.
__global__ void __launch_bounds__(kRowThreads)
    HeadBlockGradKernel(const bf16* logits, const int32_t* targets, int64_t block_vocab,
                        int64_t first_row, const float* row_max, const float* row_sum,
                        float scale, bf16* dlogits) {
  const int64_t row = blockIdx.x;
  const bf16* in = logits + row * block_vocab;
  bf16* out = dlogits + row * block_vocab;
  const int64_t target = targets[row];
  if (target < 0) {
    for (int64_t c = RowFirstColumn(threadIdx.x); c < block_vocab;
         c += RowColumnStride(kRowThreads)) {
      out[c] = S::Make(0.0f);
    }
    return;
  }
  const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{row_max[row], row_sum[row]});
  for (int64_t c = RowFirstColumn(threadIdx.x); c < block_vocab;
       c += RowColumnStride(kRowThreads)) {
    out[c] = S::Make(CrossEntropyLogitGrad(S::Load(in[c]), lse, c + first_row == target, scale));
  }
}

// Before the first block: empty running states; a target logit no block set
// stays NaN (a target outside the vocabulary), which the loss carries.
__global__ void HeadStatsResetKernel(int64_t rows, float* row_max, float* row_sum,
                                     float* target_logit) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  row_max[row] = -INFINITY;
  row_sum[row] = 0.0f;
  target_logit[row] = NAN;
}

__global__ void HeadRowLossKernel(const float* row_max, const float* row_sum,
                                  const float* target_logit, const int32_t* targets, int64_t rows,
                                  float* row_loss) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  if (targets[row] < 0) {
    row_loss[row] = 0.0f;
    return;
  }
  const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{row_max[row], row_sum[row]});
  row_loss[row] = CrossEntropyRowLoss(lse, target_logit[row]);
}

constexpr int kStatsThreads = 256;

unsigned StatsBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kStatsThreads - 1) / kStatsThreads);
}

}  // namespace

namespace launch {

cudaError_t HeadStatsReset(int64_t rows, float* row_max, float* row_sum, float* target_logit,
                           cudaStream_t stream) {
  HeadStatsResetKernel<<<StatsBlocks(rows), kStatsThreads, 0, stream>>>(rows, row_max, row_sum,
                                                                         target_logit);
  return cudaGetLastError();
}

cudaError_t HeadBlockStats(const bf16* logits, const int32_t* targets, int64_t rows,
                           int64_t block_vocab, int64_t first_row, float* row_max, float* row_sum,
                           float* target_logit, cudaStream_t stream) {
  const LaunchShape shape = RowGrid(rows);
  HeadBlockStatsKernel<<<static_cast<unsigned>(shape.blocks_x), shape.threads, 0, stream>>>(
      logits, targets, block_vocab, first_row, row_max, row_sum, target_logit);
  return cudaGetLastError();
}

cudaError_t HeadBlockGrad(const bf16* logits, const int32_t* targets, int64_t rows,
                          int64_t block_vocab, int64_t first_row, const float* row_max,
                          const float* row_sum, float scale, bf16* dlogits, cudaStream_t stream) {
  const LaunchShape shape = RowGrid(rows);
  HeadBlockGradKernel<<<static_cast<unsigned>(shape.blocks_x), shape.threads, 0, stream>>>(
      logits, targets, block_vocab, first_row, row_max, row_sum, scale, dlogits);
  return cudaGetLastError();
}

cudaError_t HeadLossFromStats(const float* row_max, const float* row_sum,
                              const float* target_logit, const int32_t* targets, int64_t rows,
                              float* row_loss, float* loss_sum, cudaStream_t stream) {
  HeadRowLossKernel<<<StatsBlocks(rows), kStatsThreads, 0, stream>>>(
      row_max, row_sum, target_logit, targets, rows, row_loss);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  OrderedSumKernel<<<1, kSumThreads, 0, stream>>>(row_loss, rows, loss_sum);
  return cudaGetLastError();
}


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
