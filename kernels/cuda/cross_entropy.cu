// CUDA cross-entropy over a logits chunk: one block per row (log-sum-exp by
// merging OnlineSoftmax states, then dlogits), then one block summing the row
// losses in row order. And the same over vocabulary blocks: each block's
// logits folded into per-row running states, the loss from the states once
// every block was seen, and each block's dlogits from them.
#include "kernels/common/softmax.h"
#include "kernels/cuda/bf16_storage.h"
#include "kernels/cuda/cross_entropy_bodies.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

// The bodies live in cross_entropy_bodies.h (replayed on the CPU by
// block_bodies_test); the kernels only own the shared scratch and the index.
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyRowKernel(const bf16* logits, const int32_t* targets, int64_t vocab, float scale,
                          bf16* dlogits, float* row_loss) {
  __shared__ OnlineSoftmax scratch[kRowThreads / 32];
  CrossEntropyRow<S, kRowThreads>(logits, targets, vocab, scale, dlogits, row_loss, scratch);
}

__global__ void __launch_bounds__(kSumThreads)
    OrderedSumKernel(const float* values, int64_t n, float* total) {
  __shared__ float scratch[kSumThreads / 32];
  OrderedSumBlock<kSumThreads>(values, n, total, scratch);
}

__global__ void __launch_bounds__(kRowThreads)
    HeadBlockStatsKernel(const bf16* logits, const int32_t* targets, int64_t block_vocab,
                         int64_t first_row, float* row_max, float* row_sum,
                         float* target_logit) {
  __shared__ OnlineSoftmax scratch[kRowThreads / 32];
  HeadBlockStatsRow<S, kRowThreads>(logits, targets, block_vocab, first_row, row_max, row_sum,
                                    target_logit, scratch);
}

__global__ void __launch_bounds__(kRowThreads)
    HeadBlockGradKernel(const bf16* logits, const int32_t* targets, int64_t block_vocab,
                        int64_t first_row, const float* row_max, const float* row_sum,
                        float scale, bf16* dlogits) {
  HeadBlockGradRow<S, kRowThreads>(logits, targets, block_vocab, first_row, row_max, row_sum,
                                   scale, dlogits);
}

__device__ __forceinline__ int64_t ThisRow() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void HeadStatsResetKernel(int64_t rows, float* row_max, float* row_sum,
                                     float* target_logit) {
  HeadStatsResetThread(ThisRow(), rows, row_max, row_sum, target_logit);
}

__global__ void HeadRowLossKernel(const float* row_max, const float* row_sum,
                                  const float* target_logit, const int32_t* targets, int64_t rows,
                                  float* row_loss) {
  HeadRowLossThread(ThisRow(), rows, row_max, row_sum, target_logit, targets, row_loss);
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
